package main

import "github.com/spf13/cobra"

func newPlotCmd() *cobra.Command { return &cobra.Command{Use: "plot", Hidden: true} }

package main

import "github.com/spf13/cobra"

func newBenchCmd() *cobra.Command { return &cobra.Command{Use: "bench", Hidden: true} }

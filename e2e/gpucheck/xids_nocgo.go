//go:build !cgo

package main

import "errors"

// watchXIDs needs NVML, hence cgo; the fake GPUs' XIDs are their fault files' lines, which the
// fake backend's health watch reports as they are.
func watchXIDs(func(uuid string, xid uint64)) (func(), error) {
	return nil, errors.New("no NVML XID watch in a build without cgo")
}

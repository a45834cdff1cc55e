//go:build cgo

package main

import (
	"fmt"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// watchXIDs reports every XID event of the node's GPUs by UUID, an application's too (the
// plugin's health watch drops those), until the returned stop is called: the check's own
// view of what the GPU raised, to hold the plugin's classification against.
func watchXIDs(report func(uuid string, xid uint64)) (stop func(), err error) {
	lib := gonvml.New()
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("nvml Init: %w", ret)
	}
	set, ret := lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		_ = lib.Shutdown()
		return nil, fmt.Errorf("nvml EventSetCreate: %w", ret)
	}
	release := func() {
		_ = set.Free()
		_ = lib.Shutdown()
	}
	count, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		release()
		return nil, fmt.Errorf("nvml DeviceGetCount: %w", ret)
	}
	for i := range count {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret == gonvml.SUCCESS {
			ret = dev.RegisterEvents(gonvml.EventTypeXidCriticalError, set)
		}
		if ret != gonvml.SUCCESS {
			release()
			return nil, fmt.Errorf("nvml: register GPU %d for XID events: %w", i, ret)
		}
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			default:
			}
			data, ret := set.Wait(500)
			switch {
			case ret == gonvml.SUCCESS && data.EventType&gonvml.EventTypeXidCriticalError != 0 && data.Device != nil:
				uuid, _ := data.Device.GetUUID()
				report(uuid, data.EventData)
			case ret != gonvml.SUCCESS && ret != gonvml.ERROR_TIMEOUT:
				time.Sleep(500 * time.Millisecond)
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		release()
	}, nil
}

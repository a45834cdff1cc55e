//go:build cgo

package nvml

import (
	"reflect"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

func TestComputeProcessesJoinsContextsAndMPSClients(t *testing.T) {
	s := newMock(t)
	d := mockDevice(t, s, 2)
	d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return []gonvml.ProcessInfo{{Pid: 100}, {Pid: 200}}, gonvml.SUCCESS
	}
	d.GetMPSComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return []gonvml.ProcessInfo{{Pid: 200}, {Pid: 300}}, gonvml.SUCCESS
	}
	b := newBackend(t, s)
	pids, err := b.ComputeProcesses(d.UUID)
	if err != nil || !reflect.DeepEqual(pids, []int{100, 200, 300}) {
		t.Fatalf("ComputeProcesses = %v, %v; want [100 200 300]", pids, err)
	}
	d.GetMPSComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
	if pids, err := b.ComputeProcesses(d.UUID); err != nil || !reflect.DeepEqual(pids, []int{100, 200}) {
		t.Fatalf("without the MPS listing: %v, %v; want [100 200]", pids, err)
	}
	d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_UNKNOWN }
	if _, err := b.ComputeProcesses(d.UUID); err == nil {
		t.Fatal("a failing NVML query gave no error")
	}
}

func TestProcessUsageJoinsMemoryAndSMSamples(t *testing.T) {
	s := newMock(t)
	d := mockDevice(t, s, 1)
	d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return []gonvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 300 << 20}}, gonvml.SUCCESS
	}
	d.GetMPSComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return []gonvml.ProcessInfo{{Pid: 200, UsedGpuMemory: 2 << 30}, {Pid: 300, UsedGpuMemory: 1 << 30}}, gonvml.SUCCESS
	}
	var since []uint64
	d.GetProcessUtilizationFunc = func(last uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		since = append(since, last)
		if last >= 20 {
			return nil, gonvml.ERROR_NOT_FOUND
		}
		return []gonvml.ProcessUtilizationSample{
			{Pid: 200, TimeStamp: 10, SmUtil: 40}, {Pid: 200, TimeStamp: 20, SmUtil: 60}, {Pid: 100, TimeStamp: 15, SmUtil: 5},
		}, gonvml.SUCCESS
	}
	b := newBackend(t, s)
	got, err := b.ProcessUsage(d.UUID)
	want := []gpu.ProcessUsage{{PID: 100, MemoryBytes: 300 << 20, SMPercent: 5}, {PID: 200, MemoryBytes: 2 << 30, SMPercent: 50}, {PID: 300, MemoryBytes: 1 << 30, SMPercent: -1}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ProcessUsage = %+v, %v; want %+v", got, err, want)
	}
	// The next call asks only for samples after the newest one seen; none came.
	got, err = b.ProcessUsage(d.UUID)
	if err != nil || got[1].SMPercent != -1 || got[1].MemoryBytes != 2<<30 {
		t.Fatalf("second ProcessUsage = %+v, %v; want memory and no SM sample", got, err)
	}
	if !reflect.DeepEqual(since, []uint64{0, 20}) {
		t.Fatalf("asked for samples since %v; want [0 20]", since)
	}
	d.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) { return nil, gonvml.ERROR_UNKNOWN }
	if _, err := b.ProcessUsage(d.UUID); err == nil {
		t.Fatal("a failing utilization query gave no error")
	}
}

//go:build cgo

package nvml

import (
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

func TestFaultsFromEventsAndConditions(t *testing.T) {
	s := newMock(t)
	events := make(chan gonvml.EventData, 4)
	var mu sync.Mutex
	registered := map[int]uint64{}
	s.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) {
		return &mock.EventSet{WaitFunc: func(ms uint32) (gonvml.EventData, gonvml.Return) {
			select {
			case e := <-events:
				return e, gonvml.SUCCESS
			case <-time.After(10 * time.Millisecond):
				return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
			}
		}}, gonvml.SUCCESS
	}
	lostIndex, thermal, remapFailed := -1, false, false
	for i := range s.Devices {
		d := mockDevice(t, s, i)
		idx := i
		d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return gonvml.EventTypeAll, gonvml.SUCCESS }
		d.RegisterEventsFunc = func(types uint64, _ gonvml.EventSet) gonvml.Return {
			mu.Lock()
			defer mu.Unlock()
			registered[idx] = types
			return gonvml.SUCCESS
		}
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case idx == lostIndex:
				return 0, gonvml.ERROR_GPU_IS_LOST
			case idx == 2 && thermal:
				return gonvml.ClocksThrottleReasonHwThermalSlowdown | gonvml.ClocksEventReasonGpuIdle, gonvml.SUCCESS
			}
			return gonvml.ClocksEventReasonGpuIdle, gonvml.SUCCESS
		}
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			return 0, 1, false, idx == 3 && remapFailed, gonvml.SUCCESS
		}
	}
	b := newBackend(t, s)
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if got, errs := b.Faults(); len(errs) != 0 || len(got) != 0 {
		t.Fatalf("healthy GPUs have faults %v (%v)", got, errs)
	}
	mu.Lock()
	if registered[0] != healthEvents {
		t.Errorf("GPU 0 registered for events %#x, want %#x", registered[0], healthEvents)
	}
	lostIndex, thermal, remapFailed = 1, true, true
	mu.Unlock()
	// An application's XID says nothing about the GPU; a critical one and an ECC error latch.
	events <- gonvml.EventData{Device: s.Devices[0], EventType: gonvml.EventTypeXidCriticalError, EventData: 31}
	events <- gonvml.EventData{Device: s.Devices[0], EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
	events <- gonvml.EventData{Device: s.Devices[4], EventType: gonvml.EventTypeDoubleBitEccError}
	var got map[string][]gpu.Fault
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var errs map[string]error
		if got, errs = b.Faults(); len(errs) != 0 {
			t.Fatal(errs)
		}
		if len(got[devs[4].UUID]) > 0 {
			break
		}
	}
	want := map[int]string{0: "xid-79", 1: "lost", 2: "thermal", 3: "row-remap-failure", 4: "ecc-dbe"}
	for i, d := range devs {
		fs := got[d.UUID]
		if want[i] == "" {
			if len(fs) != 0 {
				t.Errorf("GPU %d: faults %v, want none", i, fs)
			}
			continue
		}
		if len(fs) != 1 || fs[0].Reason() != want[i] {
			t.Errorf("GPU %d: faults %v, want %s", i, fs, want[i])
		}
	}
	if f := got[devs[0].UUID]; len(f) == 1 && (!f[0].Latched || f[0].Severity() != gpu.SeverityFatal) {
		t.Errorf("XID 79: %+v, want latched and fatal", f[0])
	}

	// Conditions clear by themselves; latched events only when cleared.
	mu.Lock()
	lostIndex, thermal, remapFailed = -1, false, false
	mu.Unlock()
	if got, _ = b.Faults(); len(got) != 2 || len(got[devs[0].UUID]) != 1 || len(got[devs[4].UUID]) != 1 {
		t.Fatalf("after the conditions cleared: %v, want the two latched faults", got)
	}
	if err := b.ClearFaults(devs[0].UUID); err != nil {
		t.Fatal(err)
	}
	if got, _ = b.Faults(); len(got) != 1 || len(got[devs[4].UUID]) != 1 {
		t.Fatalf("after clearing GPU 0: %v", got)
	}
}

func TestFaultsWithoutEventsStillPollsConditions(t *testing.T) {
	s := newMock(t)
	s.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
	for i := range s.Devices {
		d := mockDevice(t, s, i)
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 0, false, false, gonvml.ERROR_NOT_SUPPORTED }
	}
	s.DeviceGetHandleByUUIDFunc = func(string) (gonvml.Device, gonvml.Return) { return nil, gonvml.ERROR_GPU_IS_LOST }
	b := newBackend(t, s)
	if _, err := b.Devices(); err != nil {
		t.Fatal(err)
	}
	got, errs := b.Faults()
	if len(errs) != 1 || errs[""] == nil {
		t.Errorf("errors %v, want one for the event set that could not be created, and no GPU unreadable", errs)
	}
	if len(got) != 8 {
		t.Fatalf("faults %v, want every GPU lost", got)
	}
}

// A GPU whose state NVML does not give is named in the errors, alone: the others' faults
// stand as read.
func TestFaultsNameTheGPUThatCannotBeRead(t *testing.T) {
	s := newMock(t)
	s.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
	for i := range s.Devices {
		d := mockDevice(t, s, i)
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
		ret := gonvml.SUCCESS
		if i == 1 {
			ret = gonvml.ERROR_UNKNOWN
		}
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 0, false, i == 2, ret }
	}
	b := newBackend(t, s)
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	got, errs := b.Faults()
	delete(errs, "") // the event set
	if len(errs) != 1 || errs[devs[1].UUID] == nil {
		t.Errorf("errors %v, want GPU 1's only", errs)
	}
	if len(got) != 1 || len(got[devs[2].UUID]) != 1 {
		t.Errorf("faults %v, want GPU 2's row-remap-failure only", got)
	}
}

//go:build cgo

package nvml

import (
	"encoding/binary"
	"fmt"
	"strings"
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
		// A driver without the recovery action field: the XID catalog decides.
		d.GetFieldValuesFunc = func([]gonvml.FieldValue) gonvml.Return { return gonvml.ERROR_NOT_SUPPORTED }
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

// Where the driver gives the GPU's recovery action with an XID, that action decides: an XID
// outside the catalog's short list that the driver says needs nothing taints nothing, a
// reset or a reboot is fatal, a drain degrades; an XID the catalog knows follows the driver
// too, either way. A field the driver does not fill falls back to the catalog.
func TestXIDsAreClassifiedByTheDriversRecoveryAction(t *testing.T) {
	s := newMock(t)
	events := make(chan gonvml.EventData, 16)
	s.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) {
		return &mock.EventSet{WaitFunc: func(uint32) (gonvml.EventData, gonvml.Return) {
			select {
			case e := <-events:
				return e, gonvml.SUCCESS
			case <-time.After(10 * time.Millisecond):
				return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
			}
		}}, gonvml.SUCCESS
	}
	type field struct {
		ret    gonvml.Return // of the field
		action gonvml.DeviceGpuRecoveryAction
	}
	// By GPU: what its driver says now.
	fields := []field{
		{gonvml.SUCCESS, gonvml.GPU_RECOVERY_ACTION_NONE},
		{gonvml.SUCCESS, gonvml.GPU_RECOVERY_ACTION_GPU_RESET},
		{gonvml.SUCCESS, gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT},
		{gonvml.SUCCESS, gonvml.GPU_RECOVERY_ACTION_DRAIN_P2P},
		{gonvml.SUCCESS, gonvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET},
		{gonvml.SUCCESS, gonvml.DeviceGpuRecoveryAction(99)},
		{gonvml.ERROR_NOT_SUPPORTED, 0},
		{gonvml.SUCCESS, gonvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN},
	}
	for i := range s.Devices {
		d := mockDevice(t, s, i)
		d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return gonvml.EventTypeAll, gonvml.SUCCESS }
		d.RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return gonvml.SUCCESS }
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 0, false, false, gonvml.ERROR_NOT_SUPPORTED }
		d.GetFieldValuesFunc = func(values []gonvml.FieldValue) gonvml.Return {
			if len(values) != 1 || values[0].FieldId != gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
				t.Errorf("GPU %d asked for fields %+v", i, values)
				return gonvml.ERROR_INVALID_ARGUMENT
			}
			values[0].NvmlReturn = uint32(fields[i].ret)
			values[0].ValueType = uint32(gonvml.VALUE_TYPE_UNSIGNED_INT)
			binary.NativeEndian.PutUint32(values[0].Value[:4], uint32(fields[i].action))
			return gonvml.SUCCESS
		}
	}
	b := newBackend(t, s)
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	b.Faults() // starts the watch
	xids := []uint64{79, 13, 69, 92, 92, 92, 69, 48}
	for i, xid := range xids {
		events <- gonvml.EventData{Device: s.Devices[i], EventType: gonvml.EventTypeXidCriticalError, EventData: xid}
	}
	// GPU 6 (the catalog's verdict on XID 69: none) and 7 (IMEX only) latch nothing; the
	// last GPU with something to latch is 5.
	var got map[string][]gpu.Fault
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, _ = b.Faults(); len(got[devs[5].UUID]) > 0 {
			break
		}
	}
	time.Sleep(100 * time.Millisecond) // the events after GPU 5's
	got, _ = b.Faults()
	want := []gpu.Severity{gpu.SeverityNone, gpu.SeverityFatal, gpu.SeverityFatal, gpu.SeverityDegraded, gpu.SeverityDegraded, gpu.SeverityFatal, gpu.SeverityNone, gpu.SeverityNone}
	for i, d := range devs {
		fs := got[d.UUID]
		if want[i] == gpu.SeverityNone {
			if len(fs) != 0 {
				t.Errorf("GPU %d (XID %d, %+v): latched %v, want nothing", i, xids[i], fields[i], fs)
			}
			continue
		}
		if len(fs) != 1 || fs[0].Severity() != want[i] || !fs[0].Latched || fs[0].Reason() != fmt.Sprintf("xid-%d", xids[i]) {
			t.Errorf("GPU %d (XID %d, %+v): latched %v, want one %s XID", i, xids[i], fields[i], fs, want[i])
		}
	}
	if fs := got[devs[5].UUID]; len(fs) == 1 && !strings.Contains(fs[0].String(), "unknown NVML recovery action 99") {
		t.Errorf("an action this version does not know is not named: %s", fs[0])
	}
}

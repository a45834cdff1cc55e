//go:build cgo

package nvml

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/uuid"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"
	"k8s.io/utils/cpuset"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// maxCPUs sizes the CPU mask NVML fills in: more CPUs than a node has.
const maxCPUs = 4096

// topologyReader fills in where each GPU sits: its PCIe root from sysfs, its nearest CPUs,
// fabric clique and NVLink island from NVML. Sharing a GPU needs none of them, so a query
// that fails only leaves its attribute out, and says so once per GPU unless the GPU does
// not support it; it never fails Devices.
type topologyReader struct {
	sysfsRoot string
	logger    klog.Logger

	// mu guards logged: the GPU UUID and attribute of each failure logged, so that it is
	// said once and not on every Devices.
	mu     sync.Mutex
	logged map[string]bool
	// read is where each GPU sits, by UUID, as first read: Devices runs on every compute
	// mode check of a prepare, and the wiring (dozens of NVML calls a GPU) does not change
	// while the plugin runs.
	read map[string]place
}

// place is where one GPU sits.
type place struct{ pcieRoot, cpuAffinity, fabricClique, nvlinkIsland string }

// fill fills in devs; handles[i] is devs[i]'s. It reads the wiring the first time it sees
// this set of GPUs. Caller holds the backend's mu.
func (r *topologyReader) fill(devs []gpu.Device, handles []gonvml.Device) {
	known := len(r.read) == len(devs)
	for _, d := range devs {
		_, ok := r.read[d.UUID]
		known = known && ok
	}
	if !known {
		r.read = make(map[string]place, len(devs))
		for i := range devs {
			d, h := &devs[i], handles[i]
			d.PCIeRoot = r.pcieRoot(d)
			d.CPUAffinity = r.cpuAffinity(d, h)
			d.FabricClique = r.fabricClique(d, h)
		}
		r.nvlinkIslands(devs, handles)
		for _, d := range devs {
			r.read[d.UUID] = place{d.PCIeRoot, d.CPUAffinity, d.FabricClique, d.NVLinkIsland}
		}
		return
	}
	for i := range devs {
		d := &devs[i]
		p := r.read[d.UUID]
		d.PCIeRoot, d.CPUAffinity, d.FabricClique, d.NVLinkIsland = p.pcieRoot, p.cpuAffinity, p.fabricClique, p.nvlinkIsland
	}
}

func (r *topologyReader) pcieRoot(d *gpu.Device) string {
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(d.PCIBusID, deviceattribute.WithFSFromRoot(r.sysfsRoot))
	if err != nil {
		r.unknown(d, "pcieRoot", err)
		return ""
	}
	return *attr.Value.StringValue
}

// cpuAffinity lists the CPUs NVML deems nearest the GPU: those of its NUMA node, or all of
// them where the GPU has none.
func (r *topologyReader) cpuAffinity(d *gpu.Device, h gonvml.Device) string {
	mask, ret := h.GetCpuAffinity(maxCPUs)
	if ret != gonvml.SUCCESS {
		r.unsupportedOrUnknown(d, "cpuAffinity", ret)
		return ""
	}
	var cpus []int
	for w, word := range mask { // bit c of word w is CPU w*UintSize+c, as in a kernel cpumask
		for ; word != 0; word &= word - 1 {
			cpus = append(cpus, w*bits.UintSize+bits.TrailingZeros(word))
		}
	}
	list := cpuset.New(cpus...).String()
	if len(list) > resourceapi.DeviceAttributeMaxValueLength {
		// The API server would refuse the whole slice.
		r.unknown(d, "cpuAffinity", fmt.Errorf("CPU list %s is longer than an attribute may be (%d)", list, resourceapi.DeviceAttributeMaxValueLength))
		return ""
	}
	return list
}

// fabricClique is "<cluster UUID>.<clique id>" of the multi-node NVLink fabric the GPU has
// registered with. A GPU of a one-node NVSwitch system registers too, in a cluster without
// a UUID: no clique then. The first version of the query has all that is read here, and
// unlike the versioned one, a test can stand in for it.
func (r *topologyReader) fabricClique(d *gpu.Device, h gonvml.Device) string {
	info, ret := h.GetGpuFabricInfo()
	switch {
	case ret != gonvml.SUCCESS:
		r.unsupportedOrUnknown(d, "fabricClique", ret)
		return ""
	case info.State == gonvml.GPU_FABRIC_STATE_NOT_SUPPORTED:
		return ""
	case info.State != gonvml.GPU_FABRIC_STATE_COMPLETED:
		// Devices is read when the plugin starts: a GPU still registering has no clique
		// until the plugin restarts.
		r.unknown(d, "fabricClique", fmt.Errorf("fabric registration not completed (state %d)", info.State))
		return ""
	case gonvml.Return(info.Status) != gonvml.SUCCESS:
		r.unknown(d, "fabricClique", fmt.Errorf("fabric registration failed: %w", gonvml.Return(info.Status)))
		return ""
	case info.ClusterUuid == [16]uint8{}:
		return ""
	}
	return fmt.Sprintf("%s.%d", uuid.UUID(info.ClusterUuid), info.CliqueId)
}

// nvlinkIslands puts the GPUs joined by an active NVLink, directly or through NVSwitches,
// in one island: a node's switches join all the GPUs whose links reach them. An island is
// named by its lowest GPU index, "nvl-0"; a GPU without NVLink peers is in none. Peers are
// joined as a chain: GPUs in one island need not all be linked to each other directly.
func (r *topologyReader) nvlinkIslands(devs []gpu.Device, handles []gonvml.Device) {
	first := make([]int, len(devs)) // union-find, each set rooted at its lowest GPU
	for i := range first {
		first[i] = i
	}
	var find func(int) int
	find = func(i int) int {
		if first[i] != i {
			first[i] = find(first[i])
		}
		return first[i]
	}
	join := func(i, j int) {
		ri, rj := find(i), find(j)
		first[max(ri, rj)] = min(ri, rj)
	}
	byBus := map[string]int{}
	for i, d := range devs {
		byBus[d.PCIBusID] = i
	}
	switched := -1 // a GPU that reaches an NVSwitch
	for i := range devs {
		peers, toSwitch := r.nvlinkPeers(&devs[i], handles[i], byBus)
		for _, j := range peers {
			join(i, j)
		}
		if toSwitch && switched >= 0 {
			join(i, switched)
		} else if toSwitch {
			switched = i
		}
	}
	size := map[int]int{}
	for i := range devs {
		size[find(i)]++
	}
	for i := range devs {
		if root := find(i); size[root] > 1 {
			devs[i].NVLinkIsland = fmt.Sprintf("nvl-%d", devs[root].Index)
		}
	}
}

// nvlinkPeers lists the node's GPUs that d's active links reach, and says whether one of them
// reaches an NVSwitch. Where NVML does not say what is at a link's far end (or says it does
// not know), a device that is not one of the node's GPUs is taken for an NVSwitch.
func (r *topologyReader) nvlinkPeers(d *gpu.Device, h gonvml.Device, byBus map[string]int) (peers []int, toSwitch bool) {
	for link := range gonvml.NVLINK_MAX_LINKS {
		state, ret := h.GetNvLinkState(link)
		switch ret {
		case gonvml.SUCCESS:
		case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND, gonvml.ERROR_INVALID_ARGUMENT:
			continue // no such link on this GPU, or no NVLink at all
		default:
			r.unknown(d, "nvlinkIsland", fmt.Errorf("nvml GetNvLinkState of link %d: %w", link, ret))
			return nil, false
		}
		if state != gonvml.FEATURE_ENABLED {
			continue
		}
		kind, ret := h.GetNvLinkRemoteDeviceType(link)
		typed := ret == gonvml.SUCCESS && kind != gonvml.NVLINK_DEVICE_TYPE_UNKNOWN
		switch {
		case typed && kind == gonvml.NVLINK_DEVICE_TYPE_SWITCH:
			toSwitch = true
			continue
		case typed && kind != gonvml.NVLINK_DEVICE_TYPE_GPU:
			continue // a CPU's NVLink port (IBM NPU): no GPU there
		}
		pci, ret := h.GetNvLinkRemotePciInfo(link)
		if ret != gonvml.SUCCESS {
			r.unsupportedOrUnknown(d, "nvlinkIsland", fmt.Errorf("nvml GetNvLinkRemotePciInfo of link %d: %w", link, ret))
			continue
		}
		bus, err := pciBusID(pci)
		if j, ok := byBus[bus]; err == nil && ok {
			peers = append(peers, j)
		} else if !typed {
			toSwitch = true
		}
	}
	return peers, toSwitch
}

// unsupportedOrUnknown says why an attribute is left out, unless NVML's answer is that the
// GPU or driver does not have it: nothing is wrong then.
func (r *topologyReader) unsupportedOrUnknown(d *gpu.Device, attribute string, err error) {
	if errors.Is(err, gonvml.ERROR_NOT_SUPPORTED) || errors.Is(err, gonvml.ERROR_FUNCTION_NOT_FOUND) {
		return
	}
	r.unknown(d, attribute, err)
}

// unknown says, once per GPU and attribute, why the attribute is left out.
func (r *topologyReader) unknown(d *gpu.Device, attribute string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := d.UUID + "/" + attribute
	if r.logged[key] {
		return
	}
	if r.logged == nil {
		r.logged = map[string]bool{}
	}
	r.logged[key] = true
	r.logger.Info("GPU attribute not published", "gpu", d.Index, "uuid", d.UUID, "attribute", attribute, "err", err)
}

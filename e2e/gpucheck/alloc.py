# A CUDA process in one tenant's container: it allocates within its cap, then past it (MPS
# must refuse), runs a kernel, and says which libcuda it loaded (the CDI spec's, not the
# host's). It then waits for a line on stdin (the plugin is restarted meanwhile) and must
# still allocate within its cap.
import os, sys, torch

name = sys.argv[1]
limit = int(os.environ["FGPU_MEMORY_LIMIT_BYTES"])
gib = 1 << 30
free, total = torch.cuda.mem_get_info()
print(f"[{name}] limit {limit/gib:.0f}GiB via {os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}; "
      f"pipe {os.environ.get('CUDA_MPS_PIPE_DIRECTORY')}; cuda sees free {free/gib:.1f}GiB of {total/gib:.1f}GiB", flush=True)
libcuda = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l})
print(f"[{name}] libcuda loaded from {libcuda}", flush=True)
x = torch.randn(1024, 1024, device="cuda")
print(f"[{name}] kernel ran: sum of x@x = {(x @ x).sum().item():.1f}", flush=True)
del x

def fill(gibs):
    held = []
    try:
        for _ in range(gibs):
            held.append(torch.empty(gib, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        return held, None
    except Exception as e:
        return held, e

within = limit // gib - 2
held, err = fill(within)
if err:
    print(f"[{name}] FAILED within the cap after {len(held)}GiB: {err}", flush=True)
    sys.exit(1)
print(f"[{name}] allocated {within}GiB within the cap: ok", flush=True)
more, err = fill(4)
if not err:
    print(f"[{name}] allocated {within + 4}GiB, past the {limit/gib:.0f}GiB cap: NOT ENFORCED", flush=True)
    sys.exit(1)
print(f"[{name}] allocating past the cap failed as it must, at {within + len(more)}GiB: "
      f"{type(err).__name__}: {str(err).splitlines()[0]}", flush=True)
del held, more
torch.cuda.empty_cache()
print(f"[{name}] phase 1 ok", flush=True)
sys.stdin.readline()
held, err = fill(within)
if err:
    print(f"[{name}] FAILED after the plugin restarted, within the cap after {len(held)}GiB: {err}", flush=True)
    sys.exit(1)
print(f"[{name}] phase 2 ok: allocated {within}GiB within the cap after the plugin restarted", flush=True)

# A CUDA process started with one claim's CDI environment: it allocates within its cap, then
# past it, and prints what happened. MPS must refuse the second allocation.
import os, sys, torch

name = sys.argv[1]
limit = int(os.environ["FGPU_MEMORY_LIMIT_BYTES"])
gib = 1 << 30
free, total = torch.cuda.mem_get_info()
print(f"[{name}] limit {limit/gib:.0f}GiB via {os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}; "
      f"pipe {os.environ.get('CUDA_MPS_PIPE_DIRECTORY')}; cuda sees free {free/gib:.1f}GiB of {total/gib:.1f}GiB", flush=True)
held = []
within = limit // gib - 2
try:
    for _ in range(within):
        held.append(torch.empty(gib, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    print(f"[{name}] allocated {within}GiB within the cap: ok", flush=True)
except Exception as e:
    print(f"[{name}] FAILED within the cap after {len(held)}GiB: {e}", flush=True)
    sys.exit(1)
try:
    for _ in range(4):
        held.append(torch.empty(gib, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    print(f"[{name}] allocated {within + 4}GiB, past the {limit/gib:.0f}GiB cap: NOT ENFORCED", flush=True)
    sys.exit(1)
except Exception as e:
    print(f"[{name}] allocating past the cap failed as it must, at {len(held)}GiB: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)

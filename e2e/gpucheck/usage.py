# The usage check's CUDA workload: one of two memory patterns on its claim's MPS server for
# SECONDS. steady: ~6 GiB held, light kernels. ramp: 2 GiB, one more every 1/12 of the run up
# to 10 GiB at two thirds of it, held to the end, heavy matmuls all along. Memory only grows,
# so that what nvidia-smi and the plugin read a moment apart can be compared.
# Usage: usage.py NAME SECONDS
import os, sys, time, torch

name, secs = sys.argv[1], float(sys.argv[2])
gib = 1 << 30
print(f"[{name}] cap {os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}; share {os.environ.get('FGPU_SHARE_ID')}", flush=True)
held = []
def hold(n):
    while len(held) < n:
        held.append(torch.empty(gib, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()

if name == "steady":
    x = torch.randn(1024, 1024, device="cuda")
    hold(6)
    start = time.time()
    print(f"[{name}] holding 6GiB, light kernels", flush=True)
    while time.time() - start < secs:
        (x @ x).sum().item()
        time.sleep(0.05)
elif name == "ramp":
    a = torch.randn(8192, 8192, device="cuda")
    c = torch.empty_like(a)
    torch.matmul(a, a, out=c)  # cuBLAS's workspace, before the pattern starts
    start, step = time.time(), secs / 12
    n = 0
    while (t := time.time() - start) < secs:
        want = min(10, 2 + int(t / step))
        if want != n:
            hold(want)
            n = want
            print(f"[{name}] t={t:.0f}s holding {n}GiB, heavy matmuls", flush=True)
        for _ in range(10):
            torch.matmul(a, a, out=c)
        torch.cuda.synchronize()
else:
    sys.exit(f"unknown pattern {name}")
print(f"[{name}] done", flush=True)

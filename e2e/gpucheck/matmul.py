# The faults check's normal workload (gpucheck faults, quiet phase): PyTorch matmuls on the
# GPU under its MPS server until stdin closes, a line every 10 s; a non-finite result or a
# CUDA error ends it with a non-zero status.
import math, select, sys, time, torch

name = sys.argv[1]
x = torch.randn(4096, 4096, device="cuda") / 64
n, last = 0, time.time()
print(f"{time.time():.3f} ready [{name}] on {torch.cuda.get_device_name(0)}", flush=True)
while True:
    for _ in range(20):
        y = x @ x
    s = y.sum().item()  # synchronises: a CUDA error surfaces here
    n += 20
    if not math.isfinite(s):
        print(f"{time.time():.3f} error [{name}] matmul {n}: sum {s}", flush=True)
        sys.exit(1)
    if time.time() - last >= 10:
        last = time.time()
        print(f"{last:.3f} ok [{name}] {n} matmuls of 4096x4096, last sum {s:.3f}", flush=True)
    if select.select([sys.stdin], [], [], 0)[0] and sys.stdin.readline() == "":
        break
print(f"{time.time():.3f} ok [{name}] done: {n} matmuls", flush=True)

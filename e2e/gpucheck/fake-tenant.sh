#!/bin/sh
# The fake-GPU variant's tenant workload, in place of alloc.py: it checks what a CUDA process
# relies on in its container (the caps in its environment, its MPS daemon answering on the
# pipe directory, the driver's files and tools, a writable /dev/shm shared with its server),
# then waits for a line on stdin (the plugin is restarted meanwhile) and checks its daemon
# again. Fake GPUs have no memory to allocate: the caps' enforcement is the real-GPU variant's.
name=$1
fail() { echo "[$name] FAIL: $*"; exit 1; }
[ -n "${FGPU_MEMORY_LIMIT_BYTES:-}" ] || fail "no memory cap in the environment"
[ -n "${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-}" ] || fail "no MPS memory limit in the environment"
[ -S "$CUDA_MPS_PIPE_DIRECTORY/control" ] || fail "no MPS control socket in $CUDA_MPS_PIPE_DIRECTORY"
echo get_server_list | fake-mps-control >/dev/null || fail "the MPS daemon does not answer"
[ -e /usr/local/nvidia/lib64/libcuda.so.1 ] || fail "no libcuda.so.1 where CUDA images look"
nvidia-smi || fail "nvidia-smi does not run"
echo "$name" > "/dev/shm/tenant-$name" || fail "cannot write /dev/shm"
echo "[$name] cap $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; devices: $(echo /dev/nvidia*); shm: $(ls /dev/shm | tr '\n' ' ')"
echo "[$name] phase 1 ok"
read -r _ || true
echo get_server_list | fake-mps-control >/dev/null || fail "the MPS daemon no longer answers after the plugin restarted"
echo "[$name] phase 2 ok: its MPS daemon still serves it"

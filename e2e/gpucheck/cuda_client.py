# An MPS client of the faults check (gpucheck faults), on libcuda through ctypes so that no
# compiler is needed. Every line is "<unix time> <event> <detail>", flushed at once:
#   illegal: a kernel stores to an unmapped address (the fatal fault), says what the
#            synchronisation returned, then waits for stdin to close;
#   loop:    small CUDA work (allocate, fill, read back, free) every 0.5 s until stdin closes,
#            saying each step's result;
#   probe:   that work once; exit status 0 only if it worked.
import ctypes, select, sys, time

mode = sys.argv[1]
cuda = ctypes.CDLL("libcuda.so.1")

# st.global to address 8: nothing is mapped there, so the GPU's MMU faults.
PTX = b"""
.version 6.4
.target sm_50
.address_size 64
.visible .entry poke(.param .u64 addr)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [addr];
	mov.u32 %r1, 42;
	st.global.u32 [%rd1], %r1;
	ret;
}
"""


def say(event, detail=""):
    print(f"{time.time():.3f} {event} {detail}".rstrip(), flush=True)


class CUDAError(Exception):
    pass


def call(name, *args):
    rc = getattr(cuda, name)(*args)
    if rc != 0:
        s = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(s))
        raise CUDAError(f"{name}: {(s.value or b'?').decode()} ({rc})")


def init():
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    call("cuInit", 0)
    call("cuDeviceGet", ctypes.byref(dev), 0)
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)


def work(step):
    n = 1 << 18
    ptr, out = ctypes.c_uint64(), ctypes.c_uint32()
    call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(4 * n))
    try:
        call("cuMemsetD32_v2", ptr, ctypes.c_uint32(step), ctypes.c_size_t(n))
        call("cuCtxSynchronize")
        call("cuMemcpyDtoH_v2", ctypes.byref(out), ptr, ctypes.c_size_t(4))
    finally:
        cuda.cuMemFree_v2(ptr)
    if out.value != step:
        raise CUDAError(f"read back {out.value}, wrote {step}")


def stdin_closed(timeout):
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and sys.stdin.readline() == ""


try:
    init()
except CUDAError as e:
    say("error", f"init {e}")
    if mode != "probe":
        stdin_closed(None)
    sys.exit(1)

if mode == "probe":
    try:
        work(7)
    except CUDAError as e:
        say("error", f"probe {e}")
        sys.exit(1)
    say("ok", "probe")
elif mode == "loop":
    say("ready")
    step = 0
    while True:
        step += 1
        try:
            work(step)
            say("ok", f"step {step}")
        except CUDAError as e:
            say("error", f"step {step} {e}")
        if stdin_closed(0.5):
            break
elif mode == "illegal":
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    try:
        call("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(PTX))
        call("cuModuleGetFunction", ctypes.byref(fn), mod, b"poke")
    except CUDAError as e:
        say("error", f"load the kernel: {e}")
        stdin_closed(None)
        sys.exit(1)
    say("ready")
    addr = ctypes.c_uint64(8)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(addr), ctypes.c_void_p))
    say("launch")
    try:
        call("cuLaunchKernel", fn, 1, 1, 1, 1, 1, 1, 0, None, params, None)
        call("cuCtxSynchronize")
        say("nofault", "cuCtxSynchronize: CUDA_SUCCESS (0)")
    except CUDAError as e:
        say("fault", str(e))
    stdin_closed(None)
else:
    sys.exit(f"unknown mode {mode}")

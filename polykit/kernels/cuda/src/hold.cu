// hold_stream(ns): one thread sleeps on the device's global timer for `ns` nanoseconds.
// The profiler launches it first so the layers it enqueues behind it (with their CUDA events)
// queue up while the GPU waits, and then run back to back: the events time the kernels, not
// the host's launch gaps. Launch: grid 1, block 1.
typedef unsigned long long u64;

extern "C" __global__ void hold_stream(u64 ns) {
  u64 t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

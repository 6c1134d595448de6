// The KV page codec's CUDA source (src/kv/kernels_cuda.cu) compiled with
// the host compiler over the thread-per-lane emulation of
// tests/cuda/emu/cuda_emu.h: the same tz_kv_cuda_* entry points, host memory
// standing in for device memory.
#define TZ_CUDA_EMULATION 1
#include "cuda_emu.h"

extern "C" {
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, enum cudaMemcpyKind, cudaStream_t) {
  memcpy(d, s, n);
  return cudaSuccess;
}
}

#include "kv/kernels_cuda.cu"

// The CUDA backend's real source (src/cuda/cuda_codec.cu) compiled with the
// host compiler over the thread-per-lane emulation of cuda_emu.h. It defines
// the same tz_cuda_* entry points as libtensorzip_cuda, with host memory
// standing in for device memory, so tz_cuda_emu_tests runs the kernels on any
// machine. The CUDA runtime calls the file makes are emulated here too.
#define TZ_CUDA_EMULATION 1
#include "cuda_emu.h"

extern "C" {
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, enum cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) {
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, enum cudaMemcpyKind, cudaStream_t) {
  memcpy(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
}

#include "cuda/cuda_codec.cu"

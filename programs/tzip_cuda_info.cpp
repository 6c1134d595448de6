// `tzip --version`: is the CUDA backend built, and is a device present?
// Compiled only when the CUDA backend is (programs/CMakeLists.txt); links the
// static CUDA runtime, so tzip starts on machines without libcudart.
#include <cuda_runtime_api.h>

#include <string>

namespace tzip {

std::string cuda_status() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("built, no usable device (") + cudaGetErrorString(e) + ")";
  if (n == 0) return "built, no device";
  cudaDeviceProp p{};
  std::string first;
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) first = std::string(", ") + p.name;
  return "built, " + std::to_string(n) + " device(s)" + first;
}

}  // namespace tzip

// "Device" memory of the tests that run CUDA kernels under the CPU emulation
// (tests/cuda/emu, tests/kv/emu): host memory, 256-aligned, with
// canaries on both sides so that a test sees any write outside the buffer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace tz_emu_test {

// A buffer of `size` bytes at p(), kGuard canary bytes (0xA5) on each side.
struct Buf {
  static constexpr size_t kGuard = 256;
  uint8_t* base;
  size_t size;
  explicit Buf(size_t n) : size(n) {
    base = (uint8_t*)std::aligned_alloc(256, (n + 2 * kGuard + 255) / 256 * 256);
    memset(base, 0xA5, n + 2 * kGuard);
  }
  ~Buf() { std::free(base); }
  Buf(const Buf&) = delete;
  uint8_t* p() const { return base + kGuard; }
  std::vector<uint8_t> get(size_t n) const { return std::vector<uint8_t>(p(), p() + n); }
  void put(const std::vector<uint8_t>& b) const {
    if (!b.empty()) memcpy(p(), b.data(), b.size());
  }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (base[i] != 0xA5 || base[kGuard + size + i] != 0xA5) return false;
    return true;
  }
};

}  // namespace tz_emu_test

// A small emulation of the CUDA primitives used by src/cuda/cuda_codec.cu,
// so that the real kernel source runs on a machine without a GPU
// (tests/cuda/emu_codec.cpp compiles it with the host compiler on top of
// this header). Every CUDA thread is a std::thread; the CTAs of a launch run
// one after the other; __syncthreads is a std::barrier over the CTA, warp
// primitives (ballot, shuffles, votes, __syncwarp) exchange values through
// per-warp slots between two barrier phases over the warp's lanes. A lane
// that exits drops out of both barriers, as an exited CUDA thread does.
//
// What it checks: the kernels' logic, indexing, bounds, the word order of
// the warp coder and the cooperation between lanes, warps and kernels. What
// it cannot: timing, memory-model subtleties weaker than the barriers it
// uses, occupancy and resource limits (registers, shared memory size),
// compiler behaviour of nvcc. Slow: keep inputs small.
#pragma once
#include <cuda_runtime_api.h>  // types and declarations only; the functions used are defined below

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define TZ_LAUNCH(grid, block, smem, stream, ...) ::tz_emu::launch(grid, block, smem, __VA_ARGS__)
#define TZ_DYNAMIC_SMEM(type, name) type* name = (type*)::tz_emu::dyn_smem()

namespace tz_emu {

struct Warp {
  explicit Warp(unsigned n) : bar((std::ptrdiff_t)n) {}
  std::barrier<> bar;
  uint64_t slot[32] = {};
};

struct Cta {
  Cta(unsigned threads, size_t smem) : bar((std::ptrdiff_t)threads), dyn((smem + 7) / 8 + 1) {
    for (unsigned w = 0; w * 32 < threads; ++w)
      warps.push_back(std::make_unique<Warp>(threads - w * 32 < 32 ? threads - w * 32 : 32));
  }
  std::barrier<> bar;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<uint64_t> dyn;
};

inline thread_local Cta* t_cta = nullptr;
inline thread_local unsigned t_lane = 0, t_warp = 0;

inline void* dyn_smem() { return t_cta->dyn.data(); }

// Exchanges one value per lane; returns every lane's value.
inline void exchange(uint64_t v, uint64_t* all) {
  Warp& w = *t_cta->warps[t_warp];
  w.slot[t_lane] = v;
  w.bar.arrive_and_wait();
  memcpy(all, w.slot, sizeof w.slot);
  w.bar.arrive_and_wait();
}

}  // namespace tz_emu

inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

inline void __syncthreads() { tz_emu::t_cta->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xFFFFFFFFu) { tz_emu::t_cta->warps[tz_emu::t_warp]->bar.arrive_and_wait(); }

inline unsigned __ballot_sync(unsigned, bool p) {
  uint64_t all[32];
  tz_emu::exchange(p ? 1 : 0, all);
  unsigned b = 0;
  for (int l = 0; l < 32; ++l) b |= (unsigned)(all[l] & 1u) << l;
  return b;
}
inline bool __all_sync(unsigned m, bool p) { return __ballot_sync(m, p) == 0xFFFFFFFFu; }
inline bool __any_sync(unsigned m, bool p) { return __ballot_sync(m, p) != 0; }

template <class T>
T __shfl_sync(unsigned, T v, int src) {
  static_assert(sizeof(T) <= 8);
  uint64_t raw = 0, all[32];
  memcpy(&raw, &v, sizeof(T));
  tz_emu::exchange(raw, all);
  T r;
  memcpy(&r, &all[src & 31], sizeof(T));
  return r;
}
template <class T>
T __shfl_up_sync(unsigned, T v, unsigned d) {
  uint64_t raw = 0, all[32];
  memcpy(&raw, &v, sizeof(T));
  tz_emu::exchange(raw, all);
  if (tz_emu::t_lane < d) return v;
  T r;
  memcpy(&r, &all[tz_emu::t_lane - d], sizeof(T));
  return r;
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline unsigned atomicMin(unsigned* p, unsigned v) {
  std::atomic_ref<unsigned> a(*p);
  unsigned cur = a.load();
  while (v < cur && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  std::atomic_ref<unsigned> a(*p);
  unsigned cur = a.load();
  while (v > cur && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::atomic_ref<unsigned long long> a(*p);
  unsigned long long cur = a.load();
  while (v < cur && !a.compare_exchange_weak(cur, v)) {
  }
  return cur;
}
template <class T>
inline T min(T a, T b) { return b < a ? b : a; }

namespace tz_emu {

// Runs a kernel over the grid: CTAs one by one, one std::thread per thread.
template <class... P>
auto launch(dim3 grid, dim3 block, size_t smem, void (*kernel)(P...)) {
  return [=](auto... args) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      Cta cta(block.x, smem);
      std::vector<std::thread> th;
      th.reserve(block.x);
      for (unsigned tx = 0; tx < block.x; ++tx) {
        th.emplace_back([&, bx, tx] {
          t_cta = &cta;
          t_lane = tx % 32;
          t_warp = tx / 32;
          threadIdx = uint3{tx, 0, 0};
          blockIdx = uint3{bx, 0, 0};
          blockDim = block;
          gridDim = grid;
          kernel(args...);
          cta.warps[t_warp]->bar.arrive_and_drop();
          cta.bar.arrive_and_drop();
        });
      }
      for (auto& t : th) t.join();
    }
  };
}

}  // namespace tz_emu

namespace cub {
template <class T, int N>
struct BlockScan {
  struct TempStorage {
    T v[N];
  };
  TempStorage& t;
  explicit BlockScan(TempStorage& s) : t(s) {}
  void ExclusiveSum(T in, T& ex, T& agg) {
    const unsigned me = threadIdx.x;
    t.v[me] = in;
    __syncthreads();
    T s = 0, a = 0;
    for (unsigned i = 0; i < N; ++i) {
      if (i < me) s += t.v[i];
      a += t.v[i];
    }
    ex = s;
    agg = a;
    __syncthreads();
  }
};
}  // namespace cub

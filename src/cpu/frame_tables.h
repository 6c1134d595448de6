// The encoder's tensor-level decisions of the CPU backend (doc/format.md 9):
// which streams of a float tensor are rANS coded, with which frequency
// tables and (level 3) lane contexts, by the policy of codec/policy.h, from
// statistics the CPU takes with its threads and SIMD kernels (histograms,
// min/max, the joint histogram of lane contexts). compress_frame
// (frame.cpp) codes the blocks with the result.
#pragma once
#include <cstdint>
#include <vector>

#include "codec/policy.h"
#include "cpu/thread_pool.h"

namespace tz::cpu {

struct TensorTables {
  uint8_t kind[kMaxStreams] = {};   // kKindRaw, kKindRans or kKindRansCtx per stream
  uint32_t freq[kMaxStreams][256];  // written for rANS streams only (not cleared: 4 KiB a frame)
  RansCtx ctx0{};                   // lane contexts of stream 0 (kind kKindRansCtx)
  std::vector<uint32_t> ctx_freq0;  // ctx0.n tables of 256
};

// Decides the streams of a float tensor (dtype != bytes) whose streams the
// policy may code (policy_codes_streams), at level >= 1; out starts with
// every stream raw.
void choose_tables(ThreadPool& pool, int level, uint8_t dtype, const uint8_t* src, uint64_t n_elems,
                   uint32_t block_elems, uint32_t n_blocks, TensorTables* out);

}  // namespace tz::cpu

// The encoder's tensor-level decisions of the CPU backend (doc/format.md 9):
// stream kinds, table sets per block (format version 3), lane contexts and
// the frequency tables, by the policy of codec/policy.h, from statistics the
// CPU takes with its threads and SIMD kernels (per-block histograms, min/max,
// the joint histogram of lane contexts). compress_frame (frame.cpp) codes
// the blocks with the result.
#pragma once
#include <cstdint>
#include <vector>

#include "codec/policy.h"
#include "common/thread_pool.h"

namespace tz::cpu {

struct StreamTables {
  uint8_t kind = kKindRaw;
  RansCtx ctx{};
  uint32_t n_sets = 1;
  std::vector<uint32_t> freq;       // n_sets x ctx.n tables of 256 (set-major)
  std::vector<uint8_t> block_set;   // table set of each block (empty: set 0 everywhere)
  uint32_t set_of(uint32_t b) const { return block_set.empty() ? 0u : block_set[b]; }
};

struct TensorTables {
  StreamTables s[kMaxStreams];
  uint8_t version = kFormatVersion;  // of the frame these tables need
};

// Decides the streams of a float tensor (dtype != bytes) whose streams the
// policy may code (policy_codes_streams), at level >= 1; out starts with
// every stream raw.
void choose_tables(ThreadPool& pool, int level, uint8_t dtype, const uint8_t* src, uint64_t n_elems,
                   uint32_t block_elems, uint32_t n_blocks, TensorTables* out);

// The table section of a frame with these tables (and version), padded to
// 4 bytes, into *out (resized); kinds of streams without tables (raw, zstd)
// are written as kind bytes.
void write_table_section(const TensorTables& t, int n_streams, std::vector<uint8_t>* out);

}  // namespace tz::cpu

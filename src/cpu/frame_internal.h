// What the CPU frame coder's files share (frame.cpp: errors, contexts, the
// encoder; frame_tables.cpp: the encoder's tensor-level decisions;
// frame_decode.cpp: the decoder and prepared frames). Not installed.
#pragma once
#include <zstd.h>

#include <cstdint>
#include <vector>

#include "codec/rans.h"
#include "cpu/checksum_cpu.h"
#include "cpu/frame.h"
#include "common/thread_pool.h"

namespace tz::cpu {

// CRC32C state update for frame_header_crc (codec/frame_prefix.h).
struct CpuCrc32c {
  uint32_t operator()(uint32_t state, const uint8_t* p, size_t n) const { return crc32c_update(state, p, n); }
};

// Entries a buffer of decode tables needs after its last table for
// build_dec_table.
constexpr size_t kDecTableSlack = 8;

// The decode table of rans_build_dec (codec/rans.h), the same entries,
// written 8 at a time: a symbol's run is written in whole groups of 8, and
// the entries past its end are overwritten by the next symbol's run, or
// land in the next table (built after this one) or the kDecTableSlack
// entries after the last table. freq must sum to kProbScale.
inline void build_dec_table(const uint32_t* freq, uint32_t* dec) {
  uint32_t start = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    const uint32_t f = freq[s];
    if (!f) continue;
    const uint32_t first = rans_dec_entry(s, f, 0);
    uint32_t* o = dec + start;
    for (uint32_t j = 0; j < f; j += 8)
      for (uint32_t t = 0; t < 8; ++t) o[j + t] = first + ((j + t) << 20);  // off << 20, as rans_dec_entry
    start += f;
  }
}

struct Context {
  explicit Context(unsigned threads)
      : pool(threads), scratch(pool.size()), out(2 * pool.size()), cctx(pool.size()), dctx(pool.size()) {}
  ~Context() {
    for (auto* c : cctx) ZSTD_freeCCtx(c);
    for (auto* d : dctx) ZSTD_freeDCtx(d);
  }
  uint8_t* worker_scratch(unsigned w, size_t bytes) {
    if (scratch[w].size() < bytes) scratch[w].resize(bytes);
    return scratch[w].data();
  }
  // Output buffer of compress_frame's pipeline slot s (s < 2 x threads).
  uint8_t* slot_out(size_t s, size_t bytes) {
    if (out[s].size() < bytes) out[s].resize(bytes);
    return out[s].data();
  }
  ThreadPool pool;
  std::vector<std::vector<uint8_t>> scratch;
  std::vector<std::vector<uint8_t>> out;
  std::vector<ZSTD_CCtx*> cctx;
  std::vector<ZSTD_DCtx*> dctx;
  std::vector<uint8_t> table_section;  // compress_frame's, kept between frames
};

}  // namespace tz::cpu

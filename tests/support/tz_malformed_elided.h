// Rows of the malformed-frame table (tz_malformed_frames.h) for zero elision
// (doc/format.md 5.10, flag bit 2, block mode 3): valid elided frames (FP32
// with zero rows, the seed stream elided behind its head), mode 3 without the
// flag, on stream 0, above a raw payload's size, and payloads one word short
// of or longer than the elements kept. Header-only; needs the tensorzip
// library and src/ on the include path.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/block.h"
#include "codec/frame_prefix.h"
#include "tensorzip/tensorzip.h"
#include "tz_frame_edit.h"
#include "tz_malformed_types.h"
#include "tz_test_data.h"

namespace tzt {

inline void add_zero_elision_rows(std::vector<MalformedFrame>& out) {
  using namespace tz;
  const int CB = TZ_ERROR_CORRUPT_BLOCK;
  auto add = [&](const std::string& rule, const Bytes& f, size_t cap, int code, Stage stage, unsigned block = 0) {
    out.push_back({rule, f, cap, code, code, stage, kDefectNone, block});
  };
  // Two blocks of 4096 and one of 300; a fifth of the rows zero: streams
  // 1-3 coded kinds, elided in every block (no seed stream).
  const Bytes rows = f32_with_zero_rows(2 * 4096 + 300, 256, 5);
  const Bytes fr = compress_cpu(rows, TZ_DTYPE_F32, 1, 4096);
  // One zero row in 32 (block 0's first; block 1 has none): streams 1-3 raw
  // kinds, stream 3 the seed stream.
  const Bytes sparse = f32_with_zero_rows(2 * 4096, 256, 32);
  const Bytes fs = compress_cpu(sparse, TZ_DTYPE_F32, 1, 4096);
  const std::vector<ParsedBlock> br = frame_blocks(fr), bs = frame_blocks(fs);
  if (!(fr[7] & kFlagZeroElided) || br[1].v.elided != 0xEu || bs[0].v.elided != 0xEu || bs[0].v.seed_stream != 3 || bs[1].v.elided != 0)
    throw std::runtime_error("malformed_frames: zero-elision frames are not elided as expected");
  const size_t cap = rows.size();
  add("elided: FP32 zero rows (valid)", fr, cap, TZ_OK, Stage::kValid);
  add("elided: the seed stream behind its seeds (valid)", fs, sparse.size(), TZ_OK, Stage::kValid);
  {
    FrameParts p(fr);
    p.set8(7, p.hdr[7] & ~kFlagZeroElided);
    add("elided: mode 3 without flag bit 2", p.bytes(), cap, CB, Stage::kBlockHeader, 0);
  }
  {
    FrameParts p(fr);
    p.set_word(1, 0, (p.word(1, 0) & 0x3FFFFFFFu) | (uint32_t)kModeRawElided << 30);
    add("elided: mode 3 on stream 0", p.bytes(), cap, CB, Stage::kBlockHeader, 1);
  }
  // Stream k of block b with its payload shortened by 4 bytes, or 4 zero
  // bytes longer (sizes of a multiple of 4: zero rows keep whole rows).
  auto resized = [&](const Bytes& f, unsigned b, int k, int delta) {
    FrameParts p(f);
    const uint32_t size = stream_word_v3_size(p.word(b, k));
    if (size % 4) throw std::runtime_error("malformed_frames: elided payload not a multiple of 4");
    const size_t end = payload_offset(p, b, k, 4) + size;
    if (delta < 0)
      p.blocks[b].erase(p.blocks[b].begin() + (long)end - 4, p.blocks[b].begin() + (long)end);
    else
      p.blocks[b].insert(p.blocks[b].begin() + (long)end, 4, 0);
    p.set_word(b, k, stream_word_v3(size + delta, kModeRawElided, 0));
    return p.bytes();
  };
  add("elided: payload one word short of the elements kept", resized(fr, 1, 2, -4), cap, CB, Stage::kBlockDecode, 1);
  add("elided: payload one word past the elements kept", resized(fr, 0, 1, 4), cap, CB, Stage::kBlockDecode, 0);
  add("elided: seed stream's payload one word short", resized(fs, 0, 3, -4), sparse.size(), CB, Stage::kBlockDecode,
      0);
  // Block 0 (4096 elements, a fifth of them zero) with stream 1's payload
  // replaced by `size` zero bytes: 4096 = n passes parse_block (mode 3 holds
  // at most n bytes) and fails the count of kept elements; 4100 fails
  // parse_block.
  auto zero_payload = [&](uint32_t size) {
    FrameParts p(fr);
    const uint32_t old = stream_word_v3_size(p.word(0, 1));
    const size_t at = payload_offset(p, 0, 1, 4);
    p.blocks[0].erase(p.blocks[0].begin() + (long)at, p.blocks[0].begin() + (long)(at + align4(old)));
    p.blocks[0].insert(p.blocks[0].begin() + (long)at, size, 0);
    p.set_word(0, 1, stream_word_v3(size, kModeRawElided, 0));
    return p.bytes();
  };
  add("elided: payload of n bytes", zero_payload(4096), cap, CB, Stage::kBlockDecode, 0);
  add("elided: payload above n bytes", zero_payload(4100), cap, CB, Stage::kBlockHeader, 0);
}

}  // namespace tzt

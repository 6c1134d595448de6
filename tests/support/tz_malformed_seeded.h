// Rows of the malformed-frame table (tz_malformed_frames.h) for seeded lane
// states (doc/format.md 5.8, flag bit 0) and self-seeded streams (5.9, flag
// bit 1): each flag where it is not allowed, each flag cleared or set on
// blocks coded the other way, lane final states, the self-seeding threshold
// of 128 elements. Header-only; needs the tensorzip library and src/ on the
// include path.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/fields.h"
#include "codec/frame_prefix.h"
#include "tensorzip/tensorzip.h"
#include "tz_frame_edit.h"
#include "tz_malformed_types.h"
#include "tz_test_data.h"

namespace tzt {

// bf3: the table's BF16 base frame as written (version 3, seeded: stream 0
// coded, stream 1 raw, three blocks of 4096, 4096 and 77 elements), bf_data
// its input.
inline void add_seeded_lane_rows(std::vector<MalformedFrame>& out, const Bytes& bf3, const Bytes& bf_data) {
  using namespace tz;
  const int kOk_ = TZ_OK;
  const int CB = TZ_ERROR_CORRUPT_BLOCK;
  const int K = 2;
  const size_t bcap = bf_data.size();
  auto add = [&](const std::string& rule, const Bytes& f, size_t cap, int code, Stage stage,
                 FrameDefect d = kDefectNone, unsigned block = 0) {
    out.push_back({rule, f, cap, code, code, stage, d, block});
  };
  auto prefix_rule = [&](const std::string& rule, const Bytes& f, size_t cap, FrameDefect d) {
    add(rule, f, cap, frame_defect_status(d), Stage::kPrefix, d);
  };
  // ---- seeded lane states (5.8): bf3 is seeded (stream 0 coded, stream 1 raw) ----
  if (!(bf3[7] & kFlagSeededLanes)) throw std::runtime_error("malformed_frames: BF16 v3 frame is not seeded");
  {
    const Bytes plain = unseed_frame(bf3);
    add("seeded: the same frame unseeded, flags 0 (valid)", plain, bcap, kOk_, Stage::kValid);
    FrameParts u(bf3);
    u.set8(7, 9);
    prefix_rule("seeded: flag bit 3 in version 3", u.bytes(), bcap, kDefectFlags);
    FrameParts u7(bf3);
    u7.set8(7, 0x80);
    prefix_rule("flags: bit 7 in version 3", u7.bytes(), bcap, kDefectFlags);
    FrameParts z(bf3);
    z.set8(7, 0);
    add("seeded: flag cleared (raw payload n - 64)", z.bytes(), bcap, CB, Stage::kBlockHeader, kDefectNone, 0);
    FrameParts o(plain);
    o.set8(7, kFlagSeededLanes);
    add("seeded: flag set on unseeded blocks (raw payload n)", o.bytes(), bcap, CB, Stage::kBlockHeader, kDefectNone,
        0);
    FrameParts v1(as_version12(bf3));
    v1.set8(7, kFlagSeededLanes);
    prefix_rule("seeded: flag in a version-1 frame", v1.bytes(), bcap, kDefectFlags);
    // Block 0's stream 0 coded with lane 3 starting at 3 x 2^16 + its seed:
    // every word is consumed and lane 3 ends with x >> 16 == 3.
    {
      uint32_t x0[kLanes];
      // Seeds of block 0: bytes 0 .. 63 of its sign|mantissa stream.
      for (int l = 0; l < kLanes; ++l) {
        uint8_t lo = 0, hi = 0, e;
        split_elem_bf16(load_le16(&bf_data[2 * (2 * l)]), e, lo);
        split_elem_bf16(load_le16(&bf_data[2 * (2 * l + 1)]), e, hi);
        x0[l] = kRansL | lo | (uint32_t)hi << 8;
      }
      x0[3] += 2 * kRansL;
      const Bytes bad = unseed_frame(bf3, x0);
      FrameParts bp(bad);
      // Put the seeded layout back: flag set, stream 1's payload without its tail.
      FrameParts good(bf3);
      Bytes blk0(bp.blocks[0].begin(), bp.blocks[0].begin() + payload_offset(bp, 0, 1, K));
      const size_t q = payload_offset(good, 0, 1, K);
      blk0.insert(blk0.end(), good.blocks[0].begin() + q, good.blocks[0].end());
      tz::store_le32(&blk0[8], good.word(0, 1));
      good.blocks[0] = blk0;
      add("seeded: lane final state with x >> 16 != 1", good.bytes(), bcap, CB, Stage::kBlockDecode, kDefectNone, 0);
    }
  }
  // ---- self-seeded streams (5.9): an FP8 frame (one stream, coded) ----
  {
    const Bytes e5 = to_f8_e5m2(normal_floats(2 * 4096 + 77, 12, 0.02f));
    const size_t ecap = e5.size();
    const Bytes f8 = compress_cpu(e5, TZ_DTYPE_F8_E5M2, 1, 4096);
    if (f8[7] != kFlagSelfSeeded) throw std::runtime_error("malformed_frames: FP8 frame is not self-seeded");
    add("self-seeded: valid FP8 frame", f8, ecap, kOk_, Stage::kValid);
    const Bytes plain = unseed_frame(f8);
    add("self-seeded: the same frame unseeded, flags 0 (valid)", plain, ecap, kOk_, Stage::kValid);
    FrameParts z(f8);
    z.set8(7, 0);
    add("self-seeded: flag cleared (n - 64 symbols coded)", z.bytes(), ecap, CB, Stage::kBlockDecode, kDefectNone, 0);
    FrameParts o(plain);
    o.set8(7, kFlagSelfSeeded);
    add("self-seeded: flag set on a stream coded without it", o.bytes(), ecap, CB, Stage::kBlockDecode, kDefectNone,
        0);
    FrameParts v1(as_version12(f8));
    v1.set8(7, kFlagSelfSeeded);
    prefix_rule("self-seeded: flag in a version-1 frame", v1.bytes(), ecap, kDefectFlags);
    FrameParts v2(as_version12(f8));
    v2.set8(4, 2);
    v2.set8(7, kFlagSelfSeeded | kFlagSeededLanes);
    prefix_rule("self-seeded: both flags in a version-2 frame", v2.bytes(), ecap, kDefectFlags);
    // Block 1's stream coded self-seeded with lane 5 starting at 3 x 2^16 +
    // its seed: every word is consumed and lane 5 ends with x >> 16 == 3.
    {
      Bytes s1(e5.begin() + 4096, e5.begin() + 2 * 4096);
      std::vector<uint32_t> x0 = self_seed_states(s1, 4096);
      add("self-seeded: the stream re-encoded from its seeds (valid)",
          recode_stream(f8, 1, 0, 4096 - kSeedBytes, x0.data()), ecap, kOk_, Stage::kValid);
      x0[5] += 2 * kRansL;
      add("self-seeded: lane final state with x >> 16 != 1", recode_stream(f8, 1, 0, 4096 - kSeedBytes, x0.data()),
          ecap, CB, Stage::kBlockDecode, kDefectNone, 1);
      x0[5] -= 2 * kRansL;
      x0[9] = kRansL;  // lane 9 unseeded: ends at L, not with its seed
      add("self-seeded: a lane's seed changed", recode_stream(f8, 1, 0, 4096 - kSeedBytes, x0.data()), ecap,
          TZ_ERROR_CHECKSUM, Stage::kBlockCrc, kDefectNone, 1);
    }
    // The threshold (n >= 128): a constant tensor (one symbol of frequency
    // 4096: a payload is its 128 state bytes) whose last block of 127 or 128
    // elements the encoder stores raw (not smaller), coded by hand.
    for (uint32_t tail : {127u, 128u}) {
      const Bytes c(4096 + tail, 0x3C);
      const Bytes fc = compress_cpu(c, TZ_DTYPE_F8_E5M2, 1, 4096);
      if (fc[7] != kFlagSelfSeeded) throw std::runtime_error("malformed_frames: constant FP8 frame not self-seeded");
      const std::vector<uint32_t> seeds = self_seed_states(Bytes(c.begin() + 4096, c.end()), tail);
      const std::string nb = std::to_string(tail) + "-element block";
      if (tail >= kSelfSeedMinElems) {
        add("self-seeded: " + nb + " coded self-seeded (valid)", recode_stream(fc, 1, 0, tail - kSeedBytes,
            seeds.data()), tail + 4096, kOk_, Stage::kValid);
        // Read as self-seeded: 64 symbols, lanes ending at L + 0, so the
        // last 64 bytes come out 0: the checksum fails.
        add("self-seeded: " + nb + " coded unseeded", recode_stream(fc, 1, 0, tail, nullptr), tail + 4096,
            TZ_ERROR_CHECKSUM, Stage::kBlockCrc, kDefectNone, 1);
      } else {
        add("self-seeded: " + nb + " coded unseeded (valid: below the threshold)",
            recode_stream(fc, 1, 0, tail, nullptr), tail + 4096, kOk_, Stage::kValid);
        add("self-seeded: " + nb + " coded self-seeded (below the threshold)",
            recode_stream(fc, 1, 0, tail - kSeedBytes, seeds.data()), tail + 4096, CB, Stage::kBlockDecode,
            kDefectNone, 1);
      }
    }
  }
}

}  // namespace tzt

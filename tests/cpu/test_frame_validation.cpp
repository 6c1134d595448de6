// The frame validator (codec/frame_prefix.h, parse_block in codec/block.h)
// over the table of malformed frames (tests/support/tz_malformed_frames.h):
// each frame is rejected by the rule it was built to break, with that rule's
// status code, on every CPU entry point. tests/cuda/emu runs the same table
// through the CUDA decoder and expects the same codes.
#include <gtest/gtest.h>

#include <set>

#include "codec/frame_prefix.h"
#include "common/crc32c.h"
#include "tz_malformed_frames.h"
#include "tz_test_util.h"

namespace {

using namespace tzt;

struct TableCrc {
  const uint32_t* t;
  uint32_t operator()(uint32_t s, const uint8_t* p, size_t n) const { return tz::crc32c_update(s, p, n, t); }
};

const std::vector<uint32_t>& crc_table() {
  static const std::vector<uint32_t> t = [] {
    std::vector<uint32_t> v(256);
    tz::crc32c_make_table(v.data());
    return v;
  }();
  return t;
}

// A frame's bytes; an empty frame as a valid pointer to no bytes (a null
// source is a parameter error, not a truncated frame).
const uint8_t* bytes_of(const Bytes& b) {
  static const uint8_t none = 0;
  return b.empty() ? &none : b.data();
}

int code_of(size_t r) { return tz_is_error(r) ? (int)tz_get_error_code(r) : TZ_OK; }

const std::vector<MalformedFrame>& table() {
  static const std::vector<MalformedFrame> t = malformed_frames();
  return t;
}

TEST(FrameValidation, TableCoversEveryPrefixRule) {
  std::set<int> seen;
  for (const auto& m : table())
    if (m.stage == Stage::kPrefix) seen.insert(m.defect);
  for (int d = tz::kDefectHeaderTruncated; d <= tz::kDefectTrailingBytes; ++d)
    EXPECT_TRUE(seen.count(d)) << "no malformed frame for " << tz::frame_defect_text((tz::FrameDefect)d);
  for (Stage s : {Stage::kValid, Stage::kDestination, Stage::kBlockHeader, Stage::kBlockDecode, Stage::kBlockCrc}) {
    bool any = false;
    for (const auto& m : table()) any |= m.stage == s;
    EXPECT_TRUE(any) << "stage " << (int)s;
  }
}

// Every entry point reports the rule's code; verify agrees with decompress
// (except the destination check, which verify has none of) and names the
// failing block.
TEST(FrameValidation, CpuCodesPerRule) {
  for (const auto& m : table()) {
    SCOPED_TRACE(m.rule);
    for (unsigned threads : {1u, 2u}) {
      Bytes out(m.dst_capacity + 16, 0x5C);
      const size_t r = tz_decompress(out.data(), m.dst_capacity, bytes_of(m.frame), m.frame.size(), threads);
      EXPECT_EQ(code_of(r), m.code) << tz_last_error_detail();
      for (size_t i = m.dst_capacity; i < out.size(); ++i) ASSERT_EQ(out[i], 0x5C) << "write past capacity";
      unsigned bad = ~0u;
      const size_t v = tz_verify(bytes_of(m.frame), m.frame.size(), threads, &bad);
      EXPECT_EQ(code_of(v), m.stage == Stage::kDestination ? TZ_OK : m.code);
      if (m.stage == Stage::kBlockHeader || m.stage == Stage::kBlockDecode || m.stage == Stage::kBlockCrc) {
        EXPECT_EQ(bad, m.block) << "first failing block";
      }
    }
    // The error detail names the rule of the prefix validator.
    if (m.stage == Stage::kPrefix && m.defect != tz::kDefectBadVersion) {
      tz_verify(bytes_of(m.frame), m.frame.size(), 1, nullptr);
      EXPECT_NE(std::string(tz_last_error_detail()).find(tz::frame_defect_text(m.defect)), std::string::npos)
          << tz_last_error_detail();
    }
  }
}

// The frame is rejected by the very check it was built to break: the shared
// validator's defect for prefix rules, parse_block for block headers, and a
// block that passes parse_block for decode and checksum failures.
TEST(FrameValidation, RejectedByTheIntendedCheck) {
  for (const auto& m : table()) {
    SCOPED_TRACE(m.rule);
    tz::FramePrefixView v{};
    uint32_t bad_entry = ~0u;
    tz::FrameDefect d = tz::parse_frame_prefix(bytes_of(m.frame), m.frame.size(), TableCrc{crc_table().data()}, &v,
                                               &bad_entry);
    if (d == tz::kDefectNone) d = tz::check_frame_extent(v.prefix_size, v.blocks_size, m.frame.size());
    if (m.stage == Stage::kPrefix) {
      EXPECT_EQ((int)d, (int)m.defect) << tz::frame_defect_text(d);
      EXPECT_EQ(tz::frame_defect_status(d), m.code);
      continue;
    }
    ASSERT_EQ(d, tz::kDefectNone) << tz::frame_defect_text(d);
    if (m.stage == Stage::kValid || m.stage == Stage::kDestination) continue;
    uint64_t off = v.prefix_size;
    for (uint32_t b = 0; b <= m.block; ++b) {
      const uint32_t sz = tz::load_le32(v.index + 4ull * b);
      tz::BlockView bv;
      const int st = tz::parse_block(v.h.n_streams, v.t.kind, v.h.version >= tz::kFormatVersionSets ? v.t.n_sets : nullptr,
                                     v.h.flags, bytes_of(m.frame) + off, sz,
                                     tz::block_elem_count(v.h, b), &bv);
      const bool header_rule = m.stage == Stage::kBlockHeader && b == m.block;
      EXPECT_EQ(st, header_rule ? (int)tz::kErrCorruptBlock : (int)tz::kOk) << "block " << b;
      off += sz;
    }
  }
}

// Zstd frames are the one valid input the GPU decoder leaves to the CPU;
// nothing else in the table is "unsupported".
TEST(FrameValidation, OnlyZstdFramesAreCpuOnly) {
  for (const auto& m : table()) {
    SCOPED_TRACE(m.rule);
    EXPECT_NE(m.code, TZ_ERROR_UNSUPPORTED);
    if (m.gpu_code != m.code) {
      EXPECT_EQ(m.gpu_code, TZ_ERROR_UNSUPPORTED);
      tz_frame_info info{};
      ASSERT_FALSE(tz_is_error(tz_frame_inspect(bytes_of(m.frame), m.frame.size(), &info)));
      EXPECT_TRUE(tz::stream_kinds_use_zstd(info.stream_kind, (int)info.n_streams));
    }
  }
}

}  // namespace

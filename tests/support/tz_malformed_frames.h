// A table of malformed frames: at least one per validation rule of the frame
// prefix (codec/frame_prefix.h: header, table section incl. lane-context
// parameters, header CRC, block index, extent), of the block header
// (parse_block in codec/block.h) and of block decoding, each built from a
// valid CPU frame by editing one part, with the header CRC recomputed unless
// the rule is about that CRC. The CPU tests (tests/cpu/test_frame_validation.cpp)
// and the CUDA emulation tests (tests/cuda/emu) run every backend over it and
// expect the same status code from each (the seeded-lane rows are in
// tz_malformed_seeded.h, the record type in tz_malformed_types.h). Header-only; needs the tensorzip
// library and src/ on the include path.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/frame_prefix.h"
#include "common/crc32c.h"
#include "tensorzip/tensorzip.h"
#include "ref_rans.h"
#include "tz_frame_edit.h"
#include "tz_malformed_elided.h"
#include "tz_malformed_seeded.h"
#include "tz_malformed_types.h"
#include "tz_test_data.h"

namespace tzt {

// The table. Base frames: BF16 of 2 x 4096 + 77 elements at level 1 with
// 4096-element blocks (stream 0 rANS, stream 1 raw; block 2 partial), F32 at
// level 2, a level-3 frame with lane contexts, all three in the version-1/2
// layout (as_version12); the BF16 frame as written (version 3: table sets,
// compact tables); and dtype-bytes frames (raw and zstd).
inline std::vector<MalformedFrame> malformed_frames() {
  using namespace tz;
  std::vector<MalformedFrame> out;
  const int kOk_ = TZ_OK;
  auto add = [&](const std::string& rule, const Bytes& f, size_t cap, int code, Stage stage,
                 FrameDefect d = kDefectNone, unsigned block = 0, int gpu_code = -1) {
    out.push_back({rule, f, cap, code, gpu_code < 0 ? code : gpu_code, stage, d, block});
  };
  auto prefix_rule = [&](const std::string& rule, const Bytes& f, size_t cap, FrameDefect d) {
    add(rule, f, cap, frame_defect_status(d), Stage::kPrefix, d);
  };

  // ---- BF16 base frame ----
  const Bytes bf_data = to_bf16(normal_floats(2 * 4096 + 77, 11, 0.02f));
  const Bytes bf3 = compress_cpu(bf_data, TZ_DTYPE_BF16, 1, 4096);
  const Bytes bf = as_version12(bf3);
  const size_t bcap = bf_data.size();
  {
    tz_frame_info info{};
    tz_frame_inspect(bf.data(), bf.size(), &info);
    if (info.n_blocks != 3 || info.stream_kind[0] != kKindRans || info.stream_kind[1] != kKindRaw)
      throw std::runtime_error("malformed_frames: BF16 base frame is not rANS + raw in 3 blocks");
  }
  add("valid BF16 frame", bf, bcap, kOk_, Stage::kValid);

  // 1. fixed header
  prefix_rule("header: empty input", Bytes(), bcap, kDefectHeaderTruncated);
  prefix_rule("header: 31 bytes", Bytes(bf.begin(), bf.begin() + 31), bcap, kDefectHeaderTruncated);
  auto header_rule = [&](const std::string& rule, FrameDefect d, auto&& edit) {
    FrameParts f(bf);
    f.keep_header_sizes = true;
    edit(f);
    prefix_rule(rule, f.bytes(), bcap, d);
  };
  header_rule("header: bad magic", kDefectBadMagic, [](FrameParts& f) { f.set8(0, 'X'); });
  header_rule("header: version 0", kDefectBadVersion, [](FrameParts& f) { f.set8(4, 0); });
  header_rule("header: version 4", kDefectBadVersion, [](FrameParts& f) { f.set8(4, 4); });
  header_rule("header: dtype 6", kDefectDType, [](FrameParts& f) { f.set8(5, 6); });
  header_rule("header: 3 streams for BF16", kDefectStreamCount, [](FrameParts& f) { f.set8(6, 3); });
  header_rule("header: flags 1", kDefectFlags, [](FrameParts& f) { f.set8(7, 1); });
  header_rule("header: block_elems 2048", kDefectBlockElems, [](FrameParts& f) { f.set32(16, 2048); });
  header_rule("header: block_elems 6144", kDefectBlockElems, [](FrameParts& f) { f.set32(16, 6144); });
  header_rule("header: block_elems 2^21", kDefectBlockElems, [](FrameParts& f) { f.set32(16, 1u << 21); });
  header_rule("header: odd raw_size for BF16", kDefectRawSize,
              [&](FrameParts& f) { f.set64(8, bf_data.size() + 1); });
  header_rule("header: raw_size above 2^56", kDefectRawSize,
              [](FrameParts& f) { f.set64(8, (UINT64_C(1) << 56) + 2); });
  header_rule("header: n_blocks one too many", kDefectBlockCount, [](FrameParts& f) { f.set32(20, 4); });
  header_rule("header: raw_size of 4 blocks", kDefectBlockCount,
              [&](FrameParts& f) { f.set64(8, 2 * (4096 * 3 + 10)); });
  header_rule("header: tables_size not a multiple of 4", kDefectTablesSize,
              [&](FrameParts& f) { f.set32(24, (uint32_t)f.tables.size() + 1); });
  header_rule("header: tables_size above the cap", kDefectTablesSize,
              [](FrameParts& f) { f.set32(24, (uint32_t)kMaxTablesSize + 4); });

  // 2. prefix, table section, header CRC
  {
    const size_t prefix = 32 + FrameParts(bf).tables.size() + 4 * 3;
    prefix_rule("prefix: input ends inside the block index", Bytes(bf.begin(), bf.begin() + prefix - 1), bcap,
                kDefectPrefixTruncated);
  }
  auto table_rule = [&](const std::string& rule, FrameDefect d, auto&& edit) {
    FrameParts f(bf);
    edit(f);
    prefix_rule(rule, f.bytes(), bcap, d);
  };
  const Bytes bf_tables = FrameParts(bf).tables;
  const size_t t0len = serialised_table_len(&bf_tables[1]);  // stream 0's table
  // The section rebuilt: kind 1 + table T for stream 0, kind 0 for stream 1.
  auto section = [&](const Bytes& t0) {
    Bytes s(1 + t0.size());
    s[0] = 1;
    std::copy(t0.begin(), t0.end(), s.begin() + 1);
    s.push_back(0);
    pad4(s);
    return s;
  };
  table_rule("tables: empty section", kDefectTableMissing, [](FrameParts& f) { f.tables.clear(); });
  table_rule("tables: section ends before stream 1", kDefectTableMissing, [&](FrameParts& f) {
    const Bytes t = table_67_bytes();
    f.tables = {1};
    f.tables.insert(f.tables.end(), t.begin(), t.end());  // 68 bytes: no padding, no stream 1
  });
  table_rule("tables: zstd kind in a BF16 frame", kDefectStreamKind, [](FrameParts& f) { f.tables[0] = 2; });
  table_rule("tables: kind 4", kDefectStreamKind, [](FrameParts& f) { f.tables[0] = 4; });
  table_rule("tables: kind 3 in a version-1 frame", kDefectStreamKind, [&](FrameParts& f) {
    Bytes s{3, 0, 2};
    s.insert(s.end(), bf_tables.begin() + 1, bf_tables.begin() + 1 + t0len);
    s.insert(s.end(), bf_tables.begin() + 1, bf_tables.begin() + 1 + t0len);
    s.push_back(0);
    pad4(s);
    f.tables = s;
  });
  {
    // Lane contexts whose tables are all stream 0's table decode as kind 1:
    // valid in a version-2 frame.
    FrameParts f(bf);
    Bytes s{3, 100, 2};
    s.insert(s.end(), bf_tables.begin() + 1, bf_tables.begin() + 1 + t0len);
    s.insert(s.end(), bf_tables.begin() + 1, bf_tables.begin() + 1 + t0len);
    s.push_back(0);
    pad4(s);
    f.tables = s;
    f.set8(4, 2);
    add("tables: kind 3 with identical tables in a version-2 frame (valid)", f.bytes(), bcap, kOk_, Stage::kValid);
    for (uint8_t n : {0, 1, 5, 255}) {
      FrameParts g = f;
      g.tables[2] = n;
      prefix_rule("lane contexts: n = " + std::to_string(n), g.bytes(), bcap, kDefectContextCount);
    }
  }
  table_rule("tables: frequency sum 4095", kDefectFreqTable, [&](FrameParts& f) {
    Bytes t = uniform_table();
    t.back() = 15;
    f.tables = section(t);
  });
  table_rule("tables: zero frequency", kDefectFreqTable, [&](FrameParts& f) {
    Bytes t = uniform_table();
    t[32] = 0;
    t[33] = 32;
    f.tables = section(t);
  });
  table_rule("tables: non-canonical LEB128 frequency", kDefectFreqTable, [&](FrameParts& f) {
    Bytes t = uniform_table();
    t[32] = 0x90;
    t.insert(t.begin() + 33, 0x00);
    f.tables = section(t);
  });
  table_rule("tables: frequency above 4096", kDefectFreqTable, [&](FrameParts& f) {
    Bytes t(32, 0);
    t[0] = 1;
    t.push_back(0x81);
    t.push_back(0x20);  // 1 + (0x20 << 7) = 4097
    f.tables = section(t);
  });
  table_rule("tables: frequency table cut short", kDefectFreqTable, [&](FrameParts& f) {
    Bytes s{1};
    Bytes t = uniform_table();
    s.insert(s.end(), t.begin(), t.begin() + 200);
    pad4(s);
    f.tables = s;
  });
  table_rule("tables: 4 trailing bytes", kDefectTableTrailing,
             [](FrameParts& f) { f.tables.insert(f.tables.end(), 4, 0); });
  {
    // Padding exists when the entries do not end on a 4-byte boundary.
    Bytes s = section(uniform_table());  // 1 + 288 + 1 = 290 -> 2 padding bytes
    s.back() = 1;
    FrameParts f(bf);
    f.tables = s;
    prefix_rule("tables: non-zero padding", f.bytes(), bcap, kDefectTablePadding);
  }
  {
    FrameParts f(bf);
    f.keep_crc = true;
    f.hdr[28] ^= 1;
    prefix_rule("header CRC: wrong value", f.bytes(), bcap, kDefectHeaderCrc);
    FrameParts g(bf);
    g.keep_crc = true;
    g.keep_index = true;
    g.index[0] += 4;  // the CRC covers the index: checked before the entries
    prefix_rule("header CRC: block index changed", g.bytes(), bcap, kDefectHeaderCrc);
  }

  // 3. block index
  auto index_rule = [&](const std::string& rule, uint32_t v, unsigned b) {
    FrameParts f(bf);
    f.keep_index = true;
    f.index[b] = v;
    prefix_rule(rule, f.bytes(), bcap, kDefectIndexEntry);
  };
  {
    const FrameParts f(bf);
    index_rule("index: entry not a multiple of 4", f.index[0] + 1, 0);
    index_rule("index: entry below the block header", 8, 1);
    index_rule("index: entry 0", 0, 0);
    index_rule("index: entry above the block bound", (uint32_t)block_bound(4096, 2) + 4, 0);
    index_rule("index: last (partial) block above its bound", (uint32_t)block_bound(77, 2) + 4, 2);
  }

  // 4. extent
  prefix_rule("extent: last byte missing", Bytes(bf.begin(), bf.end() - 1), bcap, kDefectFrameTruncated);
  {
    Bytes f = bf;
    f.insert(f.end(), 4, 0);
    prefix_rule("extent: 4 bytes after the frame", f, bcap, kDefectTrailingBytes);
    FrameParts g(bf);
    g.keep_index = true;
    g.index[0] += 4;
    prefix_rule("extent: index declares 4 more bytes than present", g.bytes(), bcap, kDefectFrameTruncated);
  }
  add("destination one byte too small", bf, bcap - 1, TZ_ERROR_DST_TOO_SMALL, Stage::kDestination);

  // Block headers (parse_block) and block decoding.
  const int K = 2;
  auto block_rule = [&](const std::string& rule, Stage stage, int code, unsigned b, auto&& edit) {
    FrameParts f(bf);
    edit(f);
    add(rule, f.bytes(), bcap, code, stage, kDefectNone, b);
  };
  const int CB = TZ_ERROR_CORRUPT_BLOCK;
  block_rule("block: stream size beyond the block", Stage::kBlockHeader, CB, 0,
             [](FrameParts& f) { f.set_word(0, 0, stream_word(0xFFFFFu, kModeRans)); });
  block_rule("block: non-zero padding after a raw stream", Stage::kBlockHeader, CB, 2,
             [](FrameParts& f) { f.blocks[2].back() = 1; });  // stream 1 of block 2 has 77 bytes + 3 padding
  block_rule("block: raw stream shorter than the block", Stage::kBlockHeader, CB, 0, [](FrameParts& f) {
    f.set_word(0, 1, stream_word(4096 - 4, kModeRaw));
    f.blocks[0].resize(f.blocks[0].size() - 4);
  });
  block_rule("block: rANS mode in a raw-kind stream", Stage::kBlockHeader, CB, 0,
             [](FrameParts& f) { f.set_word(0, 1, stream_word(4096, kModeRans)); });
  block_rule("block: zstd mode in a BF16 frame", Stage::kBlockHeader, CB, 1,
             [](FrameParts& f) { f.set_word(1, 1, stream_word(4096, kModeZstd)); });
  block_rule("block: zstd mode in a BF16 frame after a corrupt rANS stream", Stage::kBlockHeader, CB, 1,
             [&](FrameParts& f) {
               const size_t p0 = payload_offset(f, 1, 0, K);
               for (int i = 0; i < 8; ++i) f.blocks[1][p0 + 130 + i] ^= 0x5A;
               f.set_word(1, 1, stream_word(4096, kModeZstd));
             });
  block_rule("block: stream mode 3", Stage::kBlockHeader, CB, 0,
             [](FrameParts& f) { f.set_word(0, 1, stream_word(4096, 3)); });
  block_rule("block: payloads do not fill the block", Stage::kBlockHeader, CB, 1,
             [](FrameParts& f) { f.blocks[1].insert(f.blocks[1].end(), 4, 0); });
  // A block with stream 0 replaced by a payload of `size` bytes (zero padded).
  auto with_stream0 = [&](FrameParts& f, unsigned b, const Bytes& payload, uint8_t mode) {
    const size_t p0 = payload_offset(f, b, 0, K), p1 = payload_offset(f, b, 1, K);
    Bytes blk(f.blocks[b].begin(), f.blocks[b].begin() + p0);
    blk.insert(blk.end(), payload.begin(), payload.end());
    pad4(blk);
    blk.insert(blk.end(), f.blocks[b].begin() + p1, f.blocks[b].end());
    tz::store_le32(&blk[4], stream_word((uint32_t)payload.size(), mode));
    f.blocks[b] = blk;
  };
  block_rule("block: rANS payload shorter than the lane states", Stage::kBlockHeader, CB, 0,
             [&](FrameParts& f) { with_stream0(f, 0, Bytes(64, 7), kModeRans); });
  block_rule("block: rANS payload with an odd number of word bytes", Stage::kBlockHeader, CB, 0,
             [&](FrameParts& f) { with_stream0(f, 0, Bytes(kRansStateBytes + 3, 7), kModeRans); });
  block_rule("block: rANS words left over", Stage::kBlockDecode, CB, 1, [&](FrameParts& f) {
    const size_t p0 = payload_offset(f, 1, 0, K);
    const uint32_t size = stream_word_size(f.word(1, 0));
    Bytes pay(f.blocks[1].begin() + p0, f.blocks[1].begin() + p0 + size);
    pay.insert(pay.end(), 4, 0);
    with_stream0(f, 1, pay, kModeRans);
  });
  block_rule("block: rANS words missing", Stage::kBlockDecode, CB, 1, [&](FrameParts& f) {
    const size_t p0 = payload_offset(f, 1, 0, K);
    const uint32_t size = stream_word_size(f.word(1, 0));
    with_stream0(f, 1, Bytes(f.blocks[1].begin() + p0, f.blocks[1].begin() + p0 + size - 4), kModeRans);
  });
  block_rule("block: rANS lane state changed", Stage::kBlockDecode, CB, 0, [&](FrameParts& f) {
    f.blocks[0][payload_offset(f, 0, 0, K) + 4 * 5 + 1] ^= 0x10;
  });
  block_rule("block: stored checksum wrong", Stage::kBlockCrc, TZ_ERROR_CHECKSUM, 1,
             [](FrameParts& f) { f.blocks[1][0] ^= 1; });
  block_rule("block: raw byte changed", Stage::kBlockCrc, TZ_ERROR_CHECKSUM, 2, [&](FrameParts& f) {
    f.blocks[2][payload_offset(f, 2, 1, K) + 5] ^= 0x40;
  });
  block_rule("block: lowest failing block wins", Stage::kBlockCrc, TZ_ERROR_CHECKSUM, 0, [](FrameParts& f) {
    f.blocks[0][0] ^= 1;
    f.set_word(1, 1, stream_word(4096, kModeZstd));
  });
  block_rule("block: two full blocks swapped (salt)", Stage::kBlockCrc, TZ_ERROR_CHECKSUM, 0,
             [](FrameParts& f) { std::swap(f.blocks[0], f.blocks[1]); });

  // ---- F32 frame (4 streams) ----
  const Bytes f32_data = [] {
    const auto v = normal_floats(2 * 4096 + 5, 12, 1.0f);
    Bytes b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  }();
  const Bytes f32 = as_version12(compress_cpu(f32_data, TZ_DTYPE_F32, 2, 4096));
  add("valid F32 frame", f32, f32_data.size(), kOk_, Stage::kValid);
  {
    FrameParts f(f32);
    f.tables = {0, 0, 0, 3};  // stream 3: kind 3 with no room for base and n
    prefix_rule("lane contexts: kind 3 in a version-1 F32 frame", f.bytes(), f32_data.size(), kDefectStreamKind);
    f.set8(4, 2);
    prefix_rule("lane contexts: base and n missing (version 2)", f.bytes(), f32_data.size(), kDefectTableMissing);
    // Every stream with 3 contexts: 12 tables > 8.
    Bytes s;
    for (int k = 0; k < 4; ++k) {
      s.insert(s.end(), {3, 0, 3});
      for (int c = 0; c < 3; ++c) {
        const Bytes t = uniform_table();
        s.insert(s.end(), t.begin(), t.end());
      }
    }
    pad4(s);
    f.tables = s;
    prefix_rule("lane contexts: 12 frequency tables", f.bytes(), f32_data.size(), kDefectTooManyTables);
  }
  {
    FrameParts f(f32);
    f.keep_header_sizes = true;
    f.set8(6, 2);
    prefix_rule("header: 2 streams for F32", f.bytes(), f32_data.size(), kDefectStreamCount);
  }

  // ---- level 3: lane contexts (version 2, kind 3) ----
  {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(20000);
    float scale = 1.0f;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i % 256 == 0) scale = std::ldexp(1.0f, -(int)(rng() % 24));
      const float g = nd(rng);
      v[i] = g * g * scale;
    }
    Bytes data(v.size() * 4);
    std::memcpy(data.data(), v.data(), data.size());
    const Bytes ctx = as_version12(compress_cpu(data, TZ_DTYPE_F32, 3, 4096));
    tz_frame_info info{};
    tz_frame_inspect(ctx.data(), ctx.size(), &info);
    if (info.format_version != 2 || info.stream_kind[0] != kKindRansCtx)
      throw std::runtime_error("malformed_frames: level-3 frame without lane contexts");
    add("valid lane-context frame", ctx, data.size(), kOk_, Stage::kValid);
    FrameParts f(ctx);
    f.set8(4, 1);
    prefix_rule("lane contexts: kind 3 in a version-1 frame", f.bytes(), data.size(), kDefectStreamKind);
    FrameParts g(ctx);
    g.tables[2] = 1;
    prefix_rule("lane contexts: n = 1 in a level-3 frame", g.bytes(), data.size(), kDefectContextCount);
    FrameParts h(ctx);
    h.tables[2] = (uint8_t)(kMaxContexts + 1);
    prefix_rule("lane contexts: n = kMaxContexts + 1", h.bytes(), data.size(), kDefectContextCount);
    FrameParts r(ctx);
    r.blocks[1][payload_offset(r, 1, 0, 4) + 200] ^= 0x21;
    add("lane contexts: rANS word changed", r.bytes(), data.size(), TZ_ERROR_CORRUPT_BLOCK, Stage::kBlockDecode,
        kDefectNone, 1);
  }

  // ---- format version 3: table sets, compact tables ----
  {
    tz_frame_info info{};
    tz_frame_inspect(bf3.data(), bf3.size(), &info);
    if (info.format_version != kFormatVersionSets || info.stream_kind[0] != kKindRans)
      throw std::runtime_error("malformed_frames: BF16 base frame is not version 3");
  }
  add("valid BF16 frame, version 3", bf3, bcap, kOk_, Stage::kValid);
  add_seeded_lane_rows(out, bf3, bf_data);
  add_zero_elision_rows(out);
  FrameHeader h3{};
  check_frame_header(bf3.data(), bf3.size(), &h3);
  FrameTables t3{};
  parse_table_section(h3, bf3.data() + 32, &t3);
  const uint32_t* f0 = t3.freq[0];  // stream 0's table
  // A version-3 section: stream 0 rANS with `sets` copies of f0, stream 1 raw.
  auto section3 = [&](uint32_t sets, uint32_t declared) {
    std::vector<uint32_t> fr((size_t)std::max(sets, 1u) * 256);
    for (uint32_t j = 0; j < sets; ++j) std::memcpy(&fr[256 * j], f0, 1024);
    Bytes s(4 + sets * kCompactTableMaxBytes);
    size_t n = write_stream_table_v3(kKindRans, fr.data(), RansCtx{}, sets, s.data());
    s[1] = (uint8_t)declared;
    s.resize(n);
    s.push_back(0);
    pad4(s);
    return s;
  };
  auto table3_rule = [&](const std::string& rule, FrameDefect d, auto&& edit) {
    FrameParts f(bf3);
    edit(f);
    prefix_rule(rule, f.bytes(), bcap, d);
  };
  table3_rule("v3 tables: 0 table sets", kDefectTableSets, [&](FrameParts& f) { f.tables = section3(1, 0); });
  table3_rule("v3 tables: 33 table sets", kDefectTableSets, [&](FrameParts& f) { f.tables = section3(1, 33); });
  table3_rule("v3 tables: 2 sets declared, 1 present", kDefectFreqTable,
              [&](FrameParts& f) { f.tables = section3(1, 2); });
  // Compact table of stream 0 (byte 2 of the section: kind, n_sets, table).
  auto compact_rule = [&](const std::string& rule, auto&& edit) {
    table3_rule("v3 compact table: " + rule, kDefectFreqTable, [&](FrameParts& f) {
      Bytes s = section3(1, 1);
      edit(s);
      f.tables = s;
    });
  };
  compact_rule("lo above hi", [](Bytes& s) { s[3] = (uint8_t)(s[2] - 1); });
  compact_rule("order 13", [](Bytes& s) { s[4] = (uint8_t)((s[4] & 0xF0) | 13); });
  compact_rule("mode 3", [](Bytes& s) { s[4] = (uint8_t)((s[4] & 0x0F) | 0x30); });
  compact_rule("reserved bits", [](Bytes& s) { s[4] |= 0x40; });
  compact_rule("mode 2 without a reference table", [](Bytes& s) { s[4] = (uint8_t)((s[4] & 0x0F) | 0x20); });
  compact_rule("cut short", [](Bytes& s) { s.resize(6); s.push_back(0); pad4(s); });
  {
    // Frequencies that sum to 4096 - 1: the smallest frequency lowered by one
    // where that keeps it non-zero, else the frame is skipped.
    uint32_t fr[256];
    std::memcpy(fr, f0, sizeof fr);
    int s_dec = -1;
    for (int x = 0; x < 256; ++x)
      if (fr[x] > 1 && (s_dec < 0 || fr[x] > fr[s_dec])) s_dec = x;
    fr[s_dec] -= 1;
    Bytes s(4 + kCompactTableMaxBytes);
    s.resize(write_stream_table_v3(kKindRans, fr, RansCtx{}, 1, s.data()));
    s.push_back(0);
    pad4(s);
    table3_rule("v3 compact table: frequency sum 4095", kDefectFreqTable, [&](FrameParts& f) { f.tables = s; });
  }
  {
    // Two sets, block 1 using set 1 (the same table): valid, and decoded
    // with the set its stream word names.
    FrameParts f(bf3);
    f.tables = section3(2, 2);
    f.set_word(1, 0, f.word(1, 0) | (1u << 22));
    add("v3: block 1 names table set 1 (valid)", f.bytes(), bcap, kOk_, Stage::kValid);
    FrameParts g = f;
    g.set_word(0, 0, g.word(0, 0) | (2u << 22));
    add("v3 block: table set 2 of 2", g.bytes(), bcap, CB, Stage::kBlockHeader, kDefectNone, 0);
    FrameParts r(bf3);
    r.set_word(0, 1, r.word(0, 1) | (1u << 22));
    add("v3 block: table set on a raw stream", r.bytes(), bcap, CB, Stage::kBlockHeader, kDefectNone, 0);
    // 32 sets of stream 0 and one of stream 1: 33 tables.
    FrameParts m(bf3);
    std::vector<uint32_t> fr(32 * 256);
    for (int j = 0; j < 32; ++j) std::memcpy(&fr[256 * j], f0, 1024);
    Bytes s(4 + 32 * kCompactTableMaxBytes);
    size_t n = write_stream_table_v3(kKindRans, fr.data(), RansCtx{}, 32, s.data());
    n += write_stream_table_v3(kKindRans, fr.data(), RansCtx{}, 1, s.data() + n);
    s.resize(n);
    pad4(s);
    m.tables = s;
    prefix_rule("v3 tables: 33 tables in all", m.bytes(), bcap, kDefectTooManyTables);
  }
  {
    // F32 with 3 lane contexts on every stream: 12 tables per block.
    FrameParts f(compress_cpu(f32_data, TZ_DTYPE_F32, 2, 4096));
    Bytes s;
    std::vector<uint32_t> fr(3 * 256);
    for (int c = 0; c < 3; ++c) std::memcpy(&fr[256 * c], f0, 1024);
    for (int k = 0; k < 4; ++k) {
      const size_t at = s.size();
      s.resize(at + 4 + 3 * kCompactTableMaxBytes);
      s.resize(at + write_stream_table_v3(kKindRansCtx, fr.data(), RansCtx{0, 3}, 1, s.data() + at));
    }
    pad4(s);
    f.tables = s;
    f.set8(4, kFormatVersionSets);
    prefix_rule("v3 tables: 12 tables per block", f.bytes(), f32_data.size(), kDefectBlockTables);
  }

  // ---- dtype bytes ----
  const Bytes raw_data = hash_stream(9000, 5);
  Bytes text(9000);
  for (size_t i = 0; i < text.size(); ++i) text[i] = (uint8_t)"tensorzip frames "[i % 17];
  const Bytes braw = compress_cpu(raw_data, TZ_DTYPE_BYTES, -1, 4096);
  const Bytes bz = compress_cpu(text, TZ_DTYPE_BYTES, 1, 4096);
  {
    tz_frame_info info{};
    tz_frame_inspect(bz.data(), bz.size(), &info);
    if (info.stream_kind[0] != kKindZstd) throw std::runtime_error("malformed_frames: no zstd kind");
  }
  add("valid bytes frame, raw", braw, raw_data.size(), kOk_, Stage::kValid);
  {
    FrameParts f(braw);
    f.set_word(0, 0, stream_word(4096, kModeZstd));
    add("bytes block: zstd mode in a raw-kind stream", f.bytes(), raw_data.size(), CB, Stage::kBlockHeader,
        kDefectNone, 0);
    FrameParts g(braw);
    g.set_word(1, 0, stream_word(4096, kModeRans));
    add("bytes block: rANS mode", g.bytes(), raw_data.size(), CB, Stage::kBlockHeader, kDefectNone, 1);
    FrameParts t(braw);
    t.tables[0] = 1;
    prefix_rule("bytes tables: rANS kind", t.bytes(), raw_data.size(), kDefectStreamKind);
  }
  // zstd frames are valid and decoded by the CPU only: the GPU answers
  // TZ_ERROR_UNSUPPORTED without looking at the blocks.
  add("valid bytes frame, zstd (CPU only)", bz, text.size(), kOk_, Stage::kValid, kDefectNone, 0,
      TZ_ERROR_UNSUPPORTED);
  {
    FrameParts f(bz);
    f.blocks[0][8] ^= 0x33;  // the zstd frame magic
    add("bytes block: zstd payload not a zstd frame (CPU only)", f.bytes(), text.size(), CB, Stage::kBlockDecode,
        kDefectNone, 0, TZ_ERROR_UNSUPPORTED);
    FrameParts g(bz);
    g.blocks[1][8 + stream_word_size(g.word(1, 0)) / 2] ^= 0x33;
    add("bytes block: zstd payload decodes to other bytes (CPU only)", g.bytes(), text.size(), TZ_ERROR_CHECKSUM,
        Stage::kBlockCrc, kDefectNone, 1, TZ_ERROR_UNSUPPORTED);
  }
  return out;
}

}  // namespace tzt

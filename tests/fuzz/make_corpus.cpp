// Writes the seed corpus of the fuzz targets from the real tensors in
// tests/data (deterministic; the output is committed in tests/fuzz/corpus):
//   decompress/  small valid frames of every dtype and level, and damaged
//                copies of some of them (bit flips, truncation, trailing
//                bytes, edited header fields, swapped index entries); the
//                encoder writes format version 3, so the frames with one
//                table set are also written in the version-1/2 layout
//                (valid-v12-*), seeded frames also as written before
//                seeding (valid-unseeded-*, and with their flags swapped:
//                mut-*-seed-flag-*), self-seeded frames also as written
//                before self-seeding (valid-unselfseeded-*, and flags
//                swapped: mut-*-selfseed-flag-*), and frames with several table sets get
//                damaged copies of their sets and compact tables (v3-*)
//   roundtrip/   one control byte + real bytes (and special values) that
//                fuzz_roundtrip compresses as every dtype
// Usage: tz_make_corpus OUT_DIR   (e.g. tests/fuzz/corpus)
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tensorzip/tensorzip.h"
#include "tz_malformed_frames.h"
#include "tz_test_data.h"

using tzt::Bytes;

namespace {

std::filesystem::path g_out;

void write(const std::string& sub, const std::string& name, const Bytes& b) {
  const auto dir = g_out / sub;
  std::filesystem::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write((const char*)b.data(), (std::streamsize)b.size());
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

Bytes compress(const Bytes& src, tz_dtype dt, int level, unsigned block_elems) {
  Bytes out(tz_compress_bound(src.size()));
  tz_params p{};
  p.dtype = dt;
  p.level = level;
  p.block_elems = block_elems;
  p.threads = 1;
  const size_t r = tz_compress(out.data(), out.size(), src.data(), src.size(), &p);
  if (tz_is_error(r)) {
    std::fprintf(stderr, "compress failed: %s\n", tz_last_error_detail());
    std::exit(1);
  }
  out.resize(r);
  return out;
}

size_t elem_size(tz_dtype dt) { return dt == TZ_DTYPE_F32 ? 4 : (dt == TZ_DTYPE_BF16 || dt == TZ_DTYPE_F16) ? 2 : 1; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  const Bytes bf16 = tzt::concat(tzt::bf16_slice());
  const Bytes f32 = tzt::concat(tzt::fp32_slice());
  const std::vector<float> w = tzt::as_floats_bf16(bf16);
  // Real data of each dtype: the stored BF16 / FP32 tensors and casts of them.
  std::vector<std::pair<tz_dtype, Bytes>> data = {
      {TZ_DTYPE_BYTES, f32},
      {TZ_DTYPE_BF16, bf16},
      {TZ_DTYPE_F16, tzt::to_f16(w)},
      {TZ_DTYPE_F32, f32},
      {TZ_DTYPE_F8_E4M3, tzt::to_f8_e4m3(std::vector<float>(w.begin(), w.end()))},
      {TZ_DTYPE_F8_E5M2, tzt::to_f8_e5m2(w)},
  };
  // FP8 of raw weights (|w| < 1) uses only the low codes; scale like FP8
  // quantisation does so all exponents appear.
  for (auto& [dt, b] : data) {
    if (dt != TZ_DTYPE_F8_E4M3 && dt != TZ_DTYPE_F8_E5M2) continue;
    std::vector<float> s(w.size());
    for (size_t i = 0; i < w.size(); ++i) s[i] = w[i] * (dt == TZ_DTYPE_F8_E4M3 ? 1500.0f : 150000.0f);
    b = dt == TZ_DTYPE_F8_E4M3 ? tzt::to_f8_e4m3(s) : tzt::to_f8_e5m2(s);
  }

  int n_files = 0;
  for (const auto& [dt, src] : data) {
    const std::string name = tz_dtype_name(dt);
    const size_t es = elem_size(dt);
    struct V {
      size_t elems;
      int level;
    };
    for (const V& v : {V{0, 1}, V{1, 1}, V{100, 2}, V{100, -1}, V{4096 + 50, 1}, V{4096 + 50, 3}}) {
      const Bytes in(src.begin() + 4096, src.begin() + 4096 + (ptrdiff_t)(v.elems * es));
      const Bytes frame = compress(in, dt, v.level, 4096);
      const std::string tag = name + "-" + std::to_string(v.elems) + "-l" + std::to_string(v.level);
      write("decompress", "valid-" + tag, frame);
      ++n_files;
      if (frame[4] == 3) {
        write("decompress", "valid-v12-" + tag, tzt::as_version12(frame));
        ++n_files;
      }
      if (frame[7] & tz::kFlagSeededLanes) {
        // Seeded lane states: the frame as written before them (flags 0),
        // and the two layouts' flags swapped (raw payload sizes then wrong).
        const Bytes plain = tzt::unseed_frame(frame);
        write("decompress", "valid-unseeded-" + tag, plain);
        tzt::FrameParts a(frame), b(plain);
        a.set8(7, 0);
        b.set8(7, tz::kFlagSeededLanes);
        write("decompress", "mut-" + tag + "-seed-flag-cleared", a.bytes());
        write("decompress", "mut-" + tag + "-seed-flag-set", b.bytes());
        n_files += 3;
      }
      if (frame[7] & tz::kFlagSelfSeeded) {
        // Self-seeded streams: the frame as written before them (bit 1
        // clear), and the two layouts' flags swapped (symbol counts and
        // final states then wrong).
        const Bytes plain = tzt::unseed_frame(frame, nullptr, tz::kFlagSelfSeeded);
        write("decompress", "valid-unselfseeded-" + tag, plain);
        tzt::FrameParts a(frame), b(plain);
        a.set8(7, (uint8_t)(frame[7] & ~tz::kFlagSelfSeeded));
        b.set8(7, (uint8_t)(plain[7] | tz::kFlagSelfSeeded));
        write("decompress", "mut-" + tag + "-selfseed-flag-cleared", a.bytes());
        write("decompress", "mut-" + tag + "-selfseed-flag-set", b.bytes());
        n_files += 3;
      }
      if (v.elems != 4096 + 50 || v.level != 1) continue;
      // Damaged copies of the two-block frame.
      const size_t pr = tz_frame_prefix_size(frame.data(), frame.size());
      auto mut = [&](const std::string& what, Bytes f) {
        write("decompress", "mut-" + name + "-" + what, f);
        ++n_files;
      };
      Bytes f = frame;
      f[frame.size() / 2] ^= 0x08;
      mut("payload-bit", f);
      f = frame;
      f[pr - 4] ^= 0x04;  // last index entry
      mut("index", f);
      f = frame;
      f[40] ^= 0x01;  // tables
      mut("table", f);
      f = frame;
      f[28] ^= 0x80;  // header CRC
      mut("header-crc", f);
      mut("truncated", Bytes(frame.begin(), frame.end() - 3));
      mut("prefix-only", Bytes(frame.begin(), frame.begin() + (ptrdiff_t)pr));
      f = frame;
      f.push_back(0);
      mut("trailing", f);
      f = frame;
      f[16] = 0;
      f[17] = 0x20;  // block_elems 8192
      mut("block-elems", f);
      f = frame;
      for (int k = 0; k < 4; ++k) std::swap(f[pr - 8 + k], f[pr - 4 + k]);  // index entries swapped
      mut("index-swap", f);
    }
  }
  // Lane-context frames (format version 2, stream kind 3): Adam-v-like rows
  // of squared values with a per-row scale, at level 3, and damaged copies.
  {
    std::vector<float> v(20000);
    uint64_t h = 1;
    float scale = 1.0f;
    for (size_t i = 0; i < v.size(); ++i) {
      h = tzt::splitmix64(h);
      if (i % 256 == 0) scale = std::ldexp(1.0f, -(int)(h % 24));
      const float g = (float)((double)(h >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
      v[i] = g * g * scale;
    }
    Bytes f32(v.size() * 4);
    memcpy(f32.data(), v.data(), f32.size());
    const std::pair<tz_dtype, Bytes> ctx_inputs[] = {{TZ_DTYPE_F32, f32}, {TZ_DTYPE_BF16, tzt::to_bf16(v)}};
    for (const auto& [dt, in] : ctx_inputs) {
      const std::string name = tz_dtype_name(dt);
      const Bytes frame = compress(in, dt, 3, 4096);
      write("decompress", "valid-ctx-" + name, frame);
      write("decompress", "valid-v12-ctx-" + name, tzt::as_version12(frame));
      n_files += 2;
      Bytes f = frame;
      f[33] ^= 0x01;  // context base
      write("decompress", "mut-ctx-base-" + name, f);
      f = frame;
      f[34] = 7;  // context count out of range
      write("decompress", "mut-ctx-n-" + name, f);
      f = frame;
      f[frame.size() / 2] ^= 0x10;
      write("decompress", "mut-ctx-payload-" + name, f);
      n_files += 3;
    }
  }
  // Format version 3 with several table sets: the real BF16 / FP32 slices
  // followed by the same elements scaled by 2^-20 (other exponents), so
  // that the blocks of the two halves get table sets of their own; damaged
  // copies: a block naming a set out of range, a set on a raw stream, the
  // set count, and bits of the compact tables.
  {
    const std::pair<tz_dtype, Bytes> set_inputs[] = {{TZ_DTYPE_BF16, bf16}, {TZ_DTYPE_F32, f32}};
    for (const auto& [dt, real] : set_inputs) {
      const std::string name = tz_dtype_name(dt);
      const size_t es = elem_size(dt);
      const size_t n = std::min<size_t>(real.size() / es, 4 * 4096);
      Bytes in(real.begin(), real.begin() + (ptrdiff_t)(n * es));
      for (size_t i = 0; i < n; ++i) {
        Bytes e(real.begin() + (ptrdiff_t)(i * es), real.begin() + (ptrdiff_t)((i + 1) * es));
        if (dt == TZ_DTYPE_BF16) {
          uint16_t v = (uint16_t)(e[0] | e[1] << 8);
          const uint16_t ex = (v >> 7) & 0xFF;
          if (ex > 20 && ex < 255) v = (uint16_t)((v & ~(0xFF << 7)) | ((ex - 20) << 7));
          e[0] = (uint8_t)v;
          e[1] = (uint8_t)(v >> 8);
        } else {
          uint32_t v = (uint32_t)e[0] | (uint32_t)e[1] << 8 | (uint32_t)e[2] << 16 | (uint32_t)e[3] << 24;
          const uint32_t ex = (v >> 23) & 0xFF;
          if (ex > 20 && ex < 255) v = (v & ~(0xFFu << 23)) | ((ex - 20) << 23);
          for (int k = 0; k < 4; ++k) e[k] = (uint8_t)(v >> (8 * k));
        }
        in.insert(in.end(), e.begin(), e.end());
      }
      const Bytes frame = compress(in, dt, 2, 4096);
      tz::FrameHeader h{};
      tz::FrameTables t{};
      if (tz::check_frame_header(frame.data(), frame.size(), &h) != tz::kDefectNone ||
          tz::parse_table_section(h, frame.data() + 32, &t) != tz::kDefectNone || t.n_sets[0] < 2) {
        std::fprintf(stderr, "%s: the two-halves input did not give table sets\n", name.c_str());
        std::exit(1);
      }
      write("decompress", "valid-v3-sets-" + name, frame);
      const size_t pr = tz_frame_prefix_size(frame.data(), frame.size());
      const size_t blk0 = pr + 4;  // stream word 0 of block 0
      const size_t at = 33 + (t.kind[0] == tz::kKindRansCtx ? 2 : 0);  // stream 0's set count
      Bytes f = frame;
      f[blk0 + 3] |= 0x3F;  // set 255 (bits 22..29; mode kept)
      f[blk0 + 2] |= 0xC0;
      write("decompress", "v3-set-out-of-range-" + name, f);
      f = frame;
      f[blk0 + 4 + 2] |= 0x40;  // stream 1's set field
      write("decompress", "v3-set-on-stream-1-" + name, f);
      // Table edits with the header CRC recomputed, so that they reach the
      // table parser.
      auto table_edit = [&](const std::string& what, auto&& edit) {
        tzt::FrameParts parts(frame);
        edit(parts.tables);
        write("decompress", "v3-" + what + "-" + name, parts.bytes());
      };
      table_edit("set-count", [&](Bytes& t) { t[at - 32] = 33; });
      table_edit("set-count-0", [&](Bytes& t) { t[at - 32] = 0; });
      table_edit("table-mode", [&](Bytes& t) { t[at - 32 + 3] ^= 0x30; });
      table_edit("table-bit", [&](Bytes& t) { t[at - 32 + 6] ^= 0x01; });
      table_edit("tables-mid", [&](Bytes& t) { t[t.size() / 2] ^= 0x04; });
      n_files += 8;
    }
  }
  // Round-trip inputs: control byte (level = c % 5 - 1, block 4096 << ((c >> 3) & 3)).
  for (const auto& [dt, src] : data) {
    if (dt == TZ_DTYPE_BYTES) continue;
    const std::string name = tz_dtype_name(dt);
    for (const auto& [ctl, n] : std::vector<std::pair<uint8_t, size_t>>{{1, 257}, {2, 1000}, {3, 9001}, {4, 64}}) {
      // The control byte and n bytes of src from byte 100 on, made at their
      // final size (no insertion behind a one-byte vector).
      if (src.size() < 100 + n) {
        std::fprintf(stderr, "%s: %zu bytes of data, the round-trip inputs need %zu\n", name.c_str(), src.size(),
                     100 + n);
        std::exit(1);
      }
      Bytes in(1 + n);
      in[0] = ctl;
      std::copy_n(src.begin() + 100, n, in.begin() + 1);
      write("roundtrip", name + "-" + std::to_string(n) + "-c" + std::to_string(ctl), in);
      ++n_files;
    }
  }
  {
    // Special FP32 values (NaN payloads, infinities, signed zeros, subnormals).
    const uint32_t sp[] = {0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7FA5A5A5u, 1,
                           0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0xFFFFFFFFu};
    Bytes in(1, 2);
    for (int rep = 0; rep < 20; ++rep)
      for (uint32_t v : sp)
        for (int k = 0; k < 4; ++k) in.push_back((uint8_t)(v >> (8 * k)));
    write("roundtrip", "specials-f32", in);
    write("roundtrip", "empty", Bytes(1, 0));
    write("roundtrip", "zeros", Bytes(5000, 0));
    n_files += 3;
  }
  {
    // Zero elision (doc/format.md 5.10): FP32 with +0.0 rows, BF16 pruned
    // 2:4, each valid and with its flag cleared, an elided payload one word
    // short, and stream 0 marked elided.
    const std::pair<std::string, std::pair<tz_dtype, Bytes>> zs[] = {
        {"f32-zero-rows", {TZ_DTYPE_F32, tzt::f32_with_zero_rows(2 * 4096 + 300, 256, 5)}},
        {"bf16-2of4", {TZ_DTYPE_BF16, tzt::bf16_pruned_2of4(2 * 4096 + 300)}}};
    for (const auto& [name, z] : zs) {
      const Bytes frame = tzt::compress_cpu(z.second, z.first, 1, 4096);
      if (!(frame[7] & tz::kFlagZeroElided)) {
        std::fprintf(stderr, "%s: no zero elision\n", name.c_str());
        std::exit(1);
      }
      write("decompress", "valid-elided-" + name, frame);
      tzt::FrameParts a(frame);
      a.set8(7, a.hdr[7] & ~tz::kFlagZeroElided);
      write("decompress", "mut-elided-" + name + "-flag-cleared", a.bytes());
      tzt::FrameParts b(frame);
      const uint32_t w0 = b.word(0, 0);
      b.set_word(0, 0, (w0 & 0x3FFFFFFFu) | (uint32_t)tz::kModeRawElided << 30);
      write("decompress", "mut-elided-" + name + "-stream0", b.bytes());
      tzt::FrameParts c(frame);
      const uint32_t w = c.word(0, 1);
      const uint32_t size = tz::stream_word_v3_size(w);
      if (tz::stream_word_mode(w) == tz::kModeRawElided && size >= 4 && size % 4 == 0) {
        const size_t at = tzt::payload_offset(c, 0, 1, (int)tz::dtype_stream_count((uint8_t)z.first)) + size - 4;
        c.blocks[0].erase(c.blocks[0].begin() + (long)at, c.blocks[0].begin() + (long)at + 4);
        c.set_word(0, 1, tz::stream_word_v3(size - 4, tz::kModeRawElided, 0));
        write("decompress", "mut-elided-" + name + "-short", c.bytes());
        ++n_files;
      }
      n_files += 3;
    }
  }
  std::printf("wrote %d files under %s\n", n_files, argv[1]);
  return 0;
}

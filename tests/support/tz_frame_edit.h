// Frame editing for the malformed-frame table and the format tests: a frame
// cut into its parts (FrameParts) and put back together with its header CRC,
// serialised tables, payload offsets, a CPU frame writer, seeded and
// self-seeded frames turned back into the frames written without seeds
// (unseed_frame), and
// version-3 frames rewritten in the version-1/2 layout (as_version12), and
// every block's parsed header (frame_blocks).
// Header-only; needs the tensorzip library and src/ on the include path.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/block.h"
#include "codec/fields.h"
#include "codec/frame_prefix.h"
#include "common/crc32c.h"
#include "tensorzip/tensorzip.h"
#include "ref_rans.h"
#include "tz_test_data.h"

namespace tzt {

// A frame cut into its parts, edited, and put back together.
struct FrameParts {
  Bytes hdr;                      // 32 bytes
  Bytes tables;                   // the table section
  std::vector<uint32_t> index;    // block sizes
  std::vector<Bytes> blocks;
  bool keep_header_sizes = false;  // do not rewrite tables_size / n_blocks from the parts
  bool keep_index = false;         // do not rewrite the index from the block sizes
  bool keep_crc = false;           // do not recompute the header CRC

  explicit FrameParts(const Bytes& f) {
    tz_frame_info info{};
    if (tz_is_error(tz_frame_inspect(f.data(), f.size(), &info)) || info.frame_size != f.size())
      throw std::runtime_error("FrameParts: not a valid frame");
    hdr.assign(f.begin(), f.begin() + 32);
    const size_t tsz = tz::load_le32(&f[24]);
    tables.assign(f.begin() + 32, f.begin() + 32 + tsz);
    size_t pos = info.prefix_size;
    for (unsigned b = 0; b < info.n_blocks; ++b) {
      const uint32_t sz = tz::load_le32(&f[32 + tsz + 4 * b]);
      index.push_back(sz);
      blocks.emplace_back(f.begin() + pos, f.begin() + pos + sz);
      pos += sz;
    }
  }
  void set8(size_t at, uint8_t v) { hdr[at] = v; }
  void set32(size_t at, uint32_t v) { tz::store_le32(&hdr[at], v); }
  void set64(size_t at, uint64_t v) { tz::store_le64(&hdr[at], v); }
  uint32_t word(unsigned b, int k) const { return tz::load_le32(&blocks[b][4 + 4 * k]); }
  void set_word(unsigned b, int k, uint32_t w) { tz::store_le32(&blocks[b][4 + 4 * k], w); }

  Bytes bytes() const {
    Bytes h = hdr;
    std::vector<uint32_t> idx = index;
    if (!keep_index)
      for (size_t b = 0; b < blocks.size(); ++b) idx[b] = (uint32_t)blocks[b].size();
    if (!keep_header_sizes) {
      tz::store_le32(&h[24], (uint32_t)tables.size());
      tz::store_le32(&h[20], (uint32_t)idx.size());
    }
    Bytes out = h;
    out.insert(out.end(), tables.begin(), tables.end());
    for (uint32_t v : idx) {
      uint8_t le[4];
      tz::store_le32(le, v);
      out.insert(out.end(), le, le + 4);
    }
    if (!keep_crc) {
      static const auto table = [] {
        std::vector<uint32_t> t(256);
        tz::crc32c_make_table(t.data());
        return t;
      }();
      const size_t prefix = out.size();
      uint32_t st = tz::crc32c_update(~0u, out.data(), 28, table.data());
      st = ~tz::crc32c_update(st, out.data() + 32, prefix - 32, table.data());
      tz::store_le32(&out[28], st);
    }
    for (const Bytes& b : blocks) out.insert(out.end(), b.begin(), b.end());
    return out;
  }
};

// Bytes of the serialised frequency table at p (codec/rans.h format).
inline size_t serialised_table_len(const uint8_t* p) {
  size_t n = 32;
  for (int s = 0; s < 256; ++s)
    if ((p[s >> 3] >> (s & 7)) & 1u) n += (p[n] & 0x80u) ? 2 : 1;
  return n;
}

// A valid table: every symbol at frequency 16 (4096 in all).
inline Bytes uniform_table() {
  Bytes t(32, 0xFF);
  t.insert(t.end(), 256, 16);
  return t;
}

// A valid table of 35 symbols (0..34) with 1-byte frequencies: 67 bytes, so
// that kind byte + table end on a 4-byte boundary.
inline Bytes table_67_bytes() {
  Bytes t(32, 0);
  for (int s = 0; s < 35; ++s) t[s >> 3] |= (uint8_t)(1u << (s & 7));
  for (int s = 0; s < 35; ++s) t.push_back(s == 0 ? 118 : 117);  // 118 + 34 x 117 = 4096
  return t;
}

inline void pad4(Bytes& b) {
  while (b.size() % 4) b.push_back(0);
}

// Blocks' stream payloads (after parse_block's layout): offset of stream k's
// payload in block b, from the stream words.
inline size_t payload_offset(const FrameParts& f, unsigned b, int k, int K) {
  size_t pos = 4 + 4 * (size_t)K;
  for (int j = 0; j < k; ++j) pos += tz::align4(tz::stream_word_size(f.word(b, j)));
  return pos;
}

// Every block of a valid frame, parsed by codec/block.h's parse_block: its
// element count and view (modes, table sets, payloads: pointers into frame,
// which must outlive the result). Throws on a frame the parser rejects.
struct ParsedBlock {
  uint32_t n;
  tz::BlockView v;
};
inline std::vector<ParsedBlock> frame_blocks(const Bytes& frame) {
  tz::FrameHeader h{};
  if (tz::check_frame_header(frame.data(), frame.size(), &h) != tz::kDefectNone)
    throw std::runtime_error("frame_blocks: bad header");
  static tz::FrameTables t;  // large: not on the stack
  t = tz::FrameTables{};
  if (tz::parse_table_section(h, frame.data() + 32, &t) != tz::kDefectNone)
    throw std::runtime_error("frame_blocks: bad table section");
  std::vector<ParsedBlock> out;
  uint64_t pos = tz::frame_prefix_size(h);
  for (uint32_t b = 0; b < h.n_blocks; ++b) {
    const uint32_t sz = tz::load_le32(frame.data() + 32 + h.tables_size + 4ull * b);
    ParsedBlock pb{tz::block_elem_count(h, b), tz::BlockView{}};
    if (pos + sz > frame.size() ||
        tz::parse_block(h.n_streams, t.kind, h.version >= tz::kFormatVersionSets ? t.n_sets : nullptr, h.flags,
                        frame.data() + pos, sz, pb.n, &pb.v) != tz::kOk)
      throw std::runtime_error("frame_blocks: block " + std::to_string(b) + " rejected");
    out.push_back(pb);
    pos += sz;
  }
  return out;
}

inline Bytes compress_cpu(const Bytes& data, tz_dtype dt, int level, unsigned block_elems) {
  tz_params p{};
  p.dtype = dt;
  p.level = level;
  p.block_elems = block_elems;
  Bytes out(tz_compress_bound(data.size()));
  const size_t r = tz_compress(out.data(), out.size(), data.data(), data.size(), &p);
  if (tz_is_error(r)) throw std::runtime_error("compress_cpu failed");
  out.resize(r);
  return out;
}

// The frame with seeded lane states (doc/format.md 5.8) and self-seeded
// streams (5.9) rewritten without them: every seeded stream re-encoded from
// L over all its n symbols with the same tables, the seed stream's raw
// payload given back its head, flags 0 (what the encoder wrote before
// seeding). drop = kFlagSelfSeeded removes only self-seeding (the frames of
// before it: a self-seeded stream whose unseeded payload would not beat raw
// is stored raw, as the encoder does). Any other frame comes back unchanged.
// lane_x0, if given, replaces the initial states of the first re-encoded
// stream (an invalid stream for the final-state rule; the tail stays
// rebuilt).
inline Bytes unseed_frame(const Bytes& frame, const uint32_t* lane_x0 = nullptr,
                          uint8_t drop = tz::kFrameFlagsKnown) {
  tz::FrameHeader h{};
  if (tz::check_frame_header(frame.data(), frame.size(), &h) != tz::kDefectNone)
    throw std::runtime_error("unseed_frame: bad header");
  // Zero elision (5.10) is no seed flag, and an elided seed stream has no
  // unseeded form here: such frames are not rewritten.
  if (h.flags & tz::kFlagZeroElided) throw std::runtime_error("unseed_frame: zero elision");
  drop &= h.flags;
  if (!drop) return frame;
  if ((drop & tz::kFlagSeededLanes) && !(drop & tz::kFlagSelfSeeded) && (h.flags & tz::kFlagSelfSeeded))
    throw std::runtime_error("unseed_frame: seeded lanes dropped, self-seeding kept");  // would self-seed them
  FrameParts f(frame);
  static tz::FrameTables t;  // 32 KiB of frequencies: not on the stack
  t = tz::FrameTables{};
  if (tz::parse_table_section(h, frame.data() + 32, &t) != tz::kDefectNone)
    throw std::runtime_error("unseed_frame: bad tables");
  const int K = h.n_streams;
  for (unsigned b = 0; b < f.blocks.size(); ++b) {
    const Bytes blk = f.blocks[b];
    const uint32_t n = tz::block_elem_count(h, b);
    tz::BlockView v;
    if (tz::parse_block(K, t.kind, t.n_sets, h.flags, blk.data(), blk.size(), n, &v) != tz::kOk)
      throw std::runtime_error("unseed_frame: bad block");
    const bool from_r = v.n_seeded && (drop & tz::kFlagSeededLanes);
    const bool self = v.self_seeded && (drop & tz::kFlagSelfSeeded);
    if (!from_r && !self) continue;
    const int r = v.seed_stream;
    Bytes sr;  // the seed stream: seeds (its head), then its payload
    if (from_r) {
      sr.assign(n, 0);
      std::memcpy(sr.data() + tz::kSeedBytes * v.n_seeded, v.payload[r], v.size[r]);
    }
    std::vector<Bytes> pay(K);
    uint8_t mode[tz::kMaxStreams];
    for (int k = 0; k < K; ++k) {
      pay[k].assign(v.payload[k], v.payload[k] + v.size[k]);
      mode[k] = v.mode[k];
      const bool re_r = from_r && v.seed_at[k] != tz::BlockView::kNoSeed;
      const bool re_self = self && v.self_seeds(k);
      if (!re_r && !re_self) continue;
      const uint32_t nt = t.ctx[k].n;
      std::vector<uint32_t> freq((size_t)nt * 256), dec((size_t)nt * tz::kProbScale);
      for (uint32_t c = 0; c < nt; ++c) {
        std::memcpy(&freq[256 * c], t.freq[t.first_table[k] + v.set[k] * nt + c], 1024);
        tz::rans_build_dec(&freq[256 * c], &dec[(size_t)c * tz::kProbScale]);
      }
      Bytes sym(n);
      tz::RansCtx c = t.ctx[k];
      c.seed_out = re_r ? sr.data() + v.seed_at[k] : sym.data() + v.coded[k];
      if (tz::rans_decode_ctx(v.payload[k], v.size[k], v.coded[k], dec.data(), c, sym.data()) != tz::kOk)
        throw std::runtime_error("unseed_frame: stream does not decode");
      pay[k] = tz::ref::rans_encode(sym.data(), n, freq.data(), t.ctx[k], lane_x0);
      lane_x0 = nullptr;
      if (pay[k].size() >= n) {
        if (re_r) throw std::runtime_error("unseed_frame: unseeded stream would be stored raw");
        pay[k] = sym;
        mode[k] = tz::kModeRaw;
      }
    }
    if (from_r) pay[r] = sr;
    Bytes out(blk.begin(), blk.begin() + 4 + 4 * K);
    for (int k = 0; k < K; ++k) {
      const uint32_t w = tz::load_le32(&blk[4 + 4 * k]);
      tz::store_le32(&out[4 + 4 * k], tz::stream_word_v3((uint32_t)pay[k].size(), mode[k],
                                                         mode[k] == tz::kModeRans ? tz::stream_word_v3_set(w) : 0u));
      out.insert(out.end(), pay[k].begin(), pay[k].end());
      while (out.size() % 4) out.push_back(0);
    }
    f.blocks[b] = out;
  }
  f.set8(7, (uint8_t)(h.flags & ~drop));
  return f.bytes();
}

// The frame with stream k of block b coded in rANS mode with the frame's
// tables (set 0 where the block stored it raw, otherwise its set): its first
// n_coded symbols, lanes starting at x0 (kLanes states; null: L). The
// stream's symbols come from the decoded frame. Builds blocks a conforming
// encoder never writes (a stream coded although not smaller than raw,
// self-seeded where the rule says it is not, bad initial states).
inline Bytes recode_stream(const Bytes& frame, unsigned b, int k, uint32_t n_coded, const uint32_t* x0) {
  tz::FrameHeader h{};
  if (tz::check_frame_header(frame.data(), frame.size(), &h) != tz::kDefectNone)
    throw std::runtime_error("recode_stream: bad header");
  static tz::FrameTables t;
  t = tz::FrameTables{};
  if (tz::parse_table_section(h, frame.data() + 32, &t) != tz::kDefectNone)
    throw std::runtime_error("recode_stream: bad tables");
  if (!tz::kind_is_rans(t.kind[k])) throw std::runtime_error("recode_stream: stream has no table");
  Bytes data(h.raw_size);
  if (tz_decompress(data.data(), data.size(), frame.data(), frame.size(), 1) != data.size())
    throw std::runtime_error("recode_stream: frame does not decode");
  const int K = h.n_streams;
  const uint32_t n = tz::block_elem_count(h, b), es = tz::dtype_elem_size(h.dtype);
  std::vector<Bytes> fields(K, Bytes(n));
  uint8_t* fp[tz::kMaxStreams];
  for (int j = 0; j < K; ++j) fp[j] = fields[j].data();
  tz::split_fields(h.dtype, data.data() + (size_t)b * h.block_elems * es, n, fp);
  FrameParts f(frame);
  const uint32_t w0 = f.word(b, k);
  const uint32_t set = tz::stream_word_mode(w0) == tz::kModeRans ? tz::stream_word_v3_set(w0) : 0u;
  const uint32_t nt = t.ctx[k].n;
  std::vector<uint32_t> freq((size_t)nt * 256);
  for (uint32_t c = 0; c < nt; ++c) std::memcpy(&freq[256 * c], t.freq[t.first_table[k] + set * nt + c], 1024);
  for (uint32_t i = 0; i < n_coded; ++i)
    if (!freq[fields[k][i]]) throw std::runtime_error("recode_stream: symbol outside the table");
  const Bytes pay = tz::ref::rans_encode(fields[k].data(), n_coded, freq.data(), t.ctx[k], x0);
  const Bytes& blk = f.blocks[b];
  Bytes out(blk.begin(), blk.begin() + 4 + 4 * K);
  for (int j = 0; j < K; ++j) {
    const size_t at = payload_offset(f, b, j, K);
    const uint32_t w = f.word(b, j);
    if (j == k) {
      tz::store_le32(&out[4 + 4 * j], tz::stream_word_v3((uint32_t)pay.size(), tz::kModeRans, set));
      out.insert(out.end(), pay.begin(), pay.end());
    } else {
      out.insert(out.end(), blk.begin() + at, blk.begin() + at + tz::stream_word_v3_size(w));
    }
    while (out.size() % 4) out.push_back(0);
  }
  f.blocks[b] = out;
  return f.bytes();
}
// The initial states of a self-seeded stream (doc/format.md 5.9): L + the
// stream's symbols n - 64 .. n - 1 of block b, two per lane.
inline std::vector<uint32_t> self_seed_states(const Bytes& stream_of_block, uint32_t n) {
  std::vector<uint32_t> x0(tz::kLanes);
  for (int l = 0; l < tz::kLanes; ++l)
    x0[l] = tz::kRansL | tz::load_le16(&stream_of_block[n - tz::kSeedBytes + 2 * l]);
  return x0;
}

// The same frame in the table layout of format versions 1 and 2 (the
// encoder writes version 3 whenever a stream is coded): every rANS stream
// must have one table set. The blocks are unchanged (set 0 in every stream
// word reads the same in both layouts), so the frame decodes to the same
// bytes: decoders of versions 1-2 keep being exercised. A seeded frame is
// unseeded first (unseed_frame); a frame with zero elision (version 3 only)
// has no such form (throws).
inline Bytes as_version12(const Bytes& seeded_frame) {
  const Bytes frame = unseed_frame(seeded_frame);  // seeded lane states are version 3 only
  FrameParts f(frame);
  if (f.hdr[4] != tz::kFormatVersionSets) return frame;
  tz::FrameHeader h{};
  if (tz::check_frame_header(frame.data(), frame.size(), &h) != tz::kDefectNone)
    throw std::runtime_error("as_version12: bad header");
  tz::FrameTables t{};
  if (tz::parse_table_section(h, frame.data() + 32, &t) != tz::kDefectNone)
    throw std::runtime_error("as_version12: bad tables");
  Bytes sec;
  bool ctx = false;
  for (int k = 0; k < h.n_streams; ++k) {
    if (tz::kind_is_rans(t.kind[k]) && t.n_sets[k] != 1) throw std::runtime_error("as_version12: table sets");
    ctx |= t.kind[k] == tz::kKindRansCtx;
    const size_t at = sec.size();
    sec.resize(at + tz::stream_table_size(t.kind[k], t.freq[t.first_table[k]], t.ctx[k]));
    tz::write_stream_table(t.kind[k], t.freq[t.first_table[k]], t.ctx[k], sec.data() + at);
  }
  while (sec.size() % 4) sec.push_back(0);
  f.tables = sec;
  f.set8(4, ctx ? tz::kFormatVersionCtx : tz::kFormatVersion);
  return f.bytes();
}

inline std::vector<float> normal_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace tzt

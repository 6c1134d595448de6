// Streaming .tzip writer: safetensors in, one frame per chunk of each tensor
// out, on one ordered pipeline: groups of chunks read in order, coded in
// parallel, written in order; memory is bounded by the pipeline slots
// (workers + 1 groups), never by the file size.
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

#include <cmath>
#include <map>
#include <type_traits>

#include "codec/predict.h"
#include "tzc_internal.hpp"
#include "tzc_io.hpp"
#include "tzc_pipeline.hpp"
#include "tzc_predict.hpp"

namespace tz::container {

using namespace detail;


namespace {

struct Unit {
  TensorEntry* seg;
  uint64_t src_off;
  uint64_t raw;
  uint64_t seg_off;  // offset of the chunk inside its segment
};

using Bytes1 = std::vector<uint8_t>;

// Where a predicted tensor's predictor comes from while writing.
struct PredSrc {
  const InFile* file = nullptr;  // cast: FP32 bytes read from a safetensors file
  uint64_t abs_off = 0;          //   absolute offset of the source tensor in that file
  Reader* reader = nullptr;      // delta: previous checkpoint's .tzip
  size_t index = 0;              //   tensor index there
  const RefOriginal* orig = nullptr;  //   or its safetensors original (WriteOptions::ref_original)
  std::shared_ptr<std::vector<uint8_t>> blk;  //   the reference block decoded for the sample
  uint64_t blk_off = 0;                       //   its byte offset in the tensor
};

struct Slot {
  Buf raw{true}, comp{true};  // the group's source bytes; its frames, each at comp_off[k] (huge pages)
  std::vector<uint64_t> comp_off, comp_size, hash;
};

std::string seg_label(const TensorEntry& t) {
  return t.is_gap ? "gap at data offset " + std::to_string(t.data_begin) : "tensor '" + t.name + "'";
}

[[noreturn]] void fail_header_too_large(const std::string& in, size_t bytes) {
  fail(ErrorKind::kBadInput, in + ": tensor table too large for a .tzip header (" + std::to_string(bytes) +
                                 " bytes of JSON; the limit is " + std::to_string(kMaxHeaderBytes) + ")");
}

// The header with every frame present but each number at its shortest is a
// lower bound of the header the pass writes: a table that cannot fit is
// refused before any data is read or written.
void refuse_oversized_header(TzipHeader& h, const std::vector<Unit>& units, const std::string& in) {
  for (const Unit& u : units) u.seg->frames.push_back(FrameRef{});
  const size_t least = encode_header(h).size();
  for (const Unit& u : units) u.seg->frames.clear();
  if (least > kMaxHeaderBytes) fail_header_too_large(in, least);
}
}  // namespace

PassStats compress_file(const std::string& in, const std::string& out_path, const WriteOptions& opt) {
  return detail::compress_file_ex(in, out_path, opt, {});
}

PassStats detail::compress_file_ex(const std::string& in, const std::string& out_path, const WriteOptions& opt,
                                   const std::vector<CastSourceFile>& others) {
  if (opt.chunk_bytes < kMinChunkBytes || opt.chunk_bytes > kMaxChunkBytes ||
      (opt.chunk_bytes & (opt.chunk_bytes - 1)) != 0)
    fail(ErrorKind::kUsage, "chunk size must be a power of two between 1 MiB and 64 MiB");
  if (opt.block_elems && (opt.block_elems < 4096 || opt.block_elems > (1u << 20) ||
                          (opt.block_elems & (opt.block_elems - 1)) != 0))
    fail(ErrorKind::kUsage, "block size must be a power of two between 4096 and 1048576 elements");
  if (opt.level < -1 || opt.level > 3) fail(ErrorKind::kUsage, "level must be -1 (store), 0 (default), 1, 2 or 3");

  SafetensorsInfo st = read_safetensors_info(in);
  InFile src(in);
  if (src.size() != st.file_size) fail(ErrorKind::kIO, in + ": file changed while reading");
  check_not_same_file(in, out_path);
  src.advise_sequential();

  TzipHeader h;
  h.created_by = std::string("tensorzip ") + std::to_string(TZ_VERSION_MAJOR) + "." +
                 std::to_string(TZ_VERSION_MINOR) + "." + std::to_string(TZ_VERSION_PATCH);
  h.data_size = st.data_size;
  h.metadata = st.metadata;
  h.user_metadata = opt.user_metadata;
  h.safetensors_header = st.header_bytes;
  h.tensors = std::move(st.tensors);
  h.gaps = std::move(st.gaps);
  uint64_t chunk = opt.chunk_bytes;
  auto setup = [&](TensorEntry& t) {
    if (t.is_gap) t.codec_dtype = TZ_DTYPE_BYTES;
    t.level = opt.level;
    t.block_elems = opt.block_elems ? opt.block_elems : default_block_elems(t.codec_dtype);
    chunk = std::max<uint64_t>(chunk, t.block_bytes());
  };
  for (auto& t : h.tensors) setup(t);
  for (auto& t : h.gaps) setup(t);
  h.chunk_bytes = chunk;

  // ---- prediction discovery (doc/container.md section 12) ----------------
  std::vector<PredSrc> pred(h.tensors.size());
  std::vector<std::unique_ptr<InFile>> other_files;
  std::unique_ptr<Reader> delta_ref;
  std::unique_ptr<RefOriginal> ref_orig;  // WriteOptions::ref_original
  std::map<size_t, int> other_ref_index;  // others[i] -> references index, when used
  int delta_ref_index = -1;
  {
    struct Cand {
      const InFile* file;
      uint64_t abs_off;
      const TensorEntry* t;
      int other;  // -1 this file, else index into others
      std::vector<uint8_t> probe;
    };
    std::vector<Cand> cands;
    if (opt.predict) {
      for (const auto& t : h.tensors)
        if (t.dtype == "F32" && t.raw_size() > 0) cands.push_back(Cand{&src, st.data_start + t.data_begin, &t, -1, {}});
      for (size_t i = 0; i < others.size(); ++i) {
        other_files.push_back(std::make_unique<InFile>(others[i].st_path));
        for (const auto& t : others[i].st.tensors)
          if (t.dtype == "F32" && t.raw_size() > 0)
            cands.push_back(Cand{other_files.back().get(), others[i].st.data_start + t.data_begin, &t, (int)i, {}});
      }
    }
    if (!opt.ref.empty() && !opt.predict)
      fail(ErrorKind::kUsage, "a previous checkpoint (--ref) needs prediction (drop --no-predict)");
    if (!opt.ref.empty()) {
      check_not_same_file(opt.ref, out_path);  // the new file would replace its own reference
      delta_ref = std::make_unique<Reader>(opt.ref, opt.threads);
      // Its header checksum is recorded: the frames read must be the ones it lists.
      ReaderAccess::verify_frames_on_use(*delta_ref);
      if (!opt.ref_original.empty())  // fast path: the reference's raw bytes from its safetensors original
        ref_orig = std::make_unique<RefOriginal>(opt.ref_original, *delta_ref, opt.ref);
    } else if (!opt.ref_original.empty()) {
      fail(ErrorKind::kUsage, "ref_original (--ref-original) needs a previous checkpoint (--ref)");
    }
    CastScratch cast_scratch;
    std::vector<uint8_t> cand_bytes;
    std::vector<size_t> same_shape;  // cands of the target's shape, in order
    for (size_t ti = 0; ti < h.tensors.size(); ++ti) {
      TensorEntry& t = h.tensors[ti];
      if (t.raw_size() == 0) continue;
      const unsigned bits = dtype_bits(t.dtype);
      if (bits == 0 || bits % 8 != 0) continue;  // sub-byte dtypes: never predicted
      const unsigned esz = bits / 8;
      const uint64_t n = t.raw_size() / esz;
      const int kind = cast_kind(t.dtype);
      if (kind >= 0) {  // cast discovery (tzc_predict.hpp), candidates read from their files
        same_shape.clear();
        for (size_t j = 0; j < cands.size(); ++j)
          if (cands[j].t->shape == t.shape) same_shape.push_back(j);
        const uint64_t t_off = st.data_start + t.data_begin;
        CastData cd;
        cd.read_target = [&](uint64_t first, uint64_t count, uint8_t* dst) {
          src.pread_exact(t_off + first * 2, dst, count * 2);
        };
        cd.cand_probe = [&](size_t i, uint64_t first, uint64_t count) -> const uint8_t* {
          Cand& c = cands[same_shape[i]];
          if (c.probe.empty()) {  // same shape, so the same probe range for every target
            c.probe.resize(count * 4);
            c.file->pread_exact(c.abs_off + first * 4, c.probe.data(), count * 4);
          }
          return c.probe.data();
        };
        cd.read_cand = [&](size_t i, uint64_t first, uint64_t count, uint8_t* dst) {
          const Cand& c = cands[same_shape[i]];
          c.file->pread_exact(c.abs_off + first * 4, dst, count * 4);
        };
        const long w = find_cast_source(n, kind, opt.min_gain, same_shape.size(), cd, /*stop_at_exact=*/false,
                                        &cast_scratch);
        if (w >= 0) {
          const Cand& c = cands[same_shape[(size_t)w]];
          t.predict.kind = PredictKind::kCast;
          t.predict.source = c.t->name;
          t.predict.ref = c.other;  // mapped to a references index below
          pred[ti] = PredSrc{c.file, c.abs_off, nullptr, 0, nullptr, nullptr, 0};
        }
      }
      if (t.predict.kind == PredictKind::kNone && delta_ref) {
        const long ri = delta_ref->find(t.name);
        if (ri >= 0) {
          const TensorEntry& rt = delta_ref->tensors()[(size_t)ri];
          if (rt.dtype == t.dtype && rt.shape == t.shape) {
            // The sample: the first 16384 elements of the reference's middle
            // block. Only that block is decoded here (kept for the encoder:
            // every reference block is decoded at most once per call, and
            // the rest only for tensors that take the delta, by the
            // workers). With ref_original the same sample is read from it
            // (same decisions, same file).
            const DeltaWindow dw = delta_window(rt, esz);
            const uint64_t blk_off = dw.blk_off, blk_len = dw.blk_len, s_first = dw.first, s_elems = dw.elems;
            Bytes1 cur(s_elems * esz);
            src.pread_exact(st.data_start + t.data_begin + s_first * esz, cur.data(), cur.size());
            std::shared_ptr<Bytes1> blk;
            const uint8_t* refp;
            const TensorEntry* ot = nullptr;  // the tensor in ref_original (fast path)
            if (ref_orig)
              for (const auto& e : ref_orig->info().tensors)
                if (e.name == t.name && e.dtype == t.dtype && e.shape == t.shape) ot = &e;
            if (ot) {
              cand_bytes.resize(s_elems * esz);
              ref_orig->file().pread_exact(ref_orig->info().data_start + ot->data_begin + s_first * esz,
                                           cand_bytes.data(), cand_bytes.size());
              refp = cand_bytes.data();
            } else {
              blk = std::make_shared<Bytes1>(blk_len);
              delta_ref->read_range((size_t)ri, blk_off, blk_len, blk->data());  // exactly one block
              refp = blk->data();
            }
            if (delta_pays(cur.data(), refp, s_elems, esz, opt.min_gain)) {
              t.predict.kind = PredictKind::kDelta;
              t.predict.ref = -2;  // the delta reference, mapped below
              pred[ti] = PredSrc{nullptr, 0, delta_ref.get(), (size_t)ri, ot ? ref_orig.get() : nullptr, blk, blk_off};
            }
          }
        }
      }
    }
    // Record only the references actually used, in first-use order.
    for (auto& t : h.tensors) {
      if (t.predict.kind == PredictKind::kNone || t.predict.ref == -1) continue;
      if (t.predict.ref == -2) {
        if (delta_ref_index < 0) {
          delta_ref_index = (int)h.references.size();
          h.references.push_back(Reference{relative_path(opt.ref, out_path), delta_ref->file_checksum(), true,
                                           delta_ref->header_checksum()});
        }
        t.predict.ref = delta_ref_index;
      } else {
        const size_t oi = (size_t)t.predict.ref;
        auto it = other_ref_index.find(oi);
        if (it == other_ref_index.end()) {
          it = other_ref_index.emplace(oi, (int)h.references.size()).first;
          h.references.push_back(Reference{relative_path(others[oi].tzip_path, out_path), others[oi].xxh64, true,
                                           others[oi].header_xxh64});
        }
        t.predict.ref = it->second;
      }
    }
    for (const auto& t : h.tensors)
      if (t.predict.kind != PredictKind::kNone) h.major = kTzipVersionMajorPredicted;
  }
  link_segments(&h);

  std::vector<Unit> units;
  for (const TensorEntry* cs : h.segments) {
    auto* s = const_cast<TensorEntry*>(cs);
    for (uint64_t off = 0; off < s->raw_size(); off += chunk)
      units.push_back(Unit{s, st.data_start + s->data_begin + off, std::min(chunk, s->raw_size() - off), off});
  }
  refuse_oversized_header(h, units, in);
  std::map<const TensorEntry*, const PredSrc*> pred_of;
  for (size_t i = 0; i < h.tensors.size(); ++i)
    if (h.tensors[i].predict.kind != PredictKind::kNone) pred_of[&h.tensors[i]] = &pred[i];

  OutFile out(out_path, opt.force, in, opt.output_fd);
  XXH64_state_t* fh = XXH64_createState();
  if (!fh) fail(ErrorKind::kInternal, "out of memory");
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> fh_guard(fh, &XXH64_freeState);
  XXH64_reset(fh, 0);
  auto emit = [&](const void* p, size_t n) {
    out.write(p, n);
    XXH64_update(fh, p, n);
  };
  static const uint8_t zeros[kAlign] = {};
  auto pad = [&] {
    const uint64_t n = align_up(out.offset()) - out.offset();
    if (n) emit(zeros, n);
  };

  uint8_t pre[kPreambleSize] = {};
  std::memcpy(pre, kMagic, 4);
  put_le32(pre + 8, kFlagHeaderZstd);
  put_le16(pre + 4, h.major);
  put_le16(pre + 6, kTzipVersionMinor);
  emit(pre, sizeof pre);

  const unsigned workers = resolve_threads(opt.threads);
  CtxSet ctx(workers);
  // One group per thread plus one: the read or the write of one group
  // overlaps the coding of the others. More would only let the reads run
  // ahead of the coders, each extra slot another set of buffers first
  // touched (MiniLM, -T2: 46 -> 32 MB peak RSS, 6 % less wall time with
  // workers + 1 than with workers + 3; bench/experiments/notebook.md).
  const size_t window = workers + 1;
  ReusePool<Slot> slots(window);
  std::vector<std::vector<uint8_t>> pred_buf(workers);
  uint64_t done = st.data_start;
  if (opt.progress) opt.progress(done, st.file_size);

  // Codes one unit: raw (modified in place for a residual) -> dst.
  auto code_unit = [&](const Unit& u, uint8_t* raw, uint8_t* dst, size_t cap, unsigned w, uint64_t* comp_size,
                       uint64_t* hash) {
        if (u.seg->predict.kind != PredictKind::kNone) {
          // Residual = value XOR prediction, formed in place before coding.
          const PredSrc& ps = *pred_of.at(u.seg);
          auto& tmp = pred_buf[w];
          if (u.seg->predict.kind == PredictKind::kCast) {
            tmp.resize(u.raw * 2);
            ps.file->pread_exact(ps.abs_off + u.seg_off * 2, tmp.data(), tmp.size());
            tz::predict::cast_xor(tmp.data(), raw, u.raw / 2,
                                  u.seg->dtype == "F16" ? tz::predict::kCastF16 : tz::predict::kCastBF16);
          } else if (ps.orig) {
            // From ref_original, checked against the reference's stored block
            // checksums (CRC32C, no decoding).
            tmp.resize(u.raw);
            ps.orig->read_checked(*ps.reader, ps.index, u.seg_off, u.raw, tmp.data());
            tz::predict::xor_bytes(tmp.data(), raw, u.raw);
          } else {
            // Decode the reference's bytes of this chunk, except the block
            // already decoded for the sample.
            tmp.resize(u.raw);
            // Whole reference blocks decode straight into tmp (no bounce copy).
            const TensorEntry& rt = ps.reader->tensors()[ps.index];
            auto read_ref = [&](uint64_t o, uint64_t len, uint8_t* dst) {
              const uint64_t rb = rt.block_bytes();
              if (o % rb == 0 && (len % rb == 0 || o + len == rt.raw_size()))
                ps.reader->read_blocks(ps.index, o / rb, (len + rb - 1) / rb, dst, len);
              else
                ps.reader->read_range(ps.index, o, len, dst);
            };
            const uint64_t a = u.seg_off, b = u.seg_off + u.raw;
            const uint64_t ba = ps.blk ? std::max(a, ps.blk_off) : b;
            const uint64_t bb = ps.blk ? std::min(b, ps.blk_off + ps.blk->size()) : b;
            if (ba < bb) {
              if (a < ba) read_ref(a, ba - a, tmp.data());
              std::memcpy(tmp.data() + (ba - a), ps.blk->data() + (ba - ps.blk_off), bb - ba);
              if (bb < b) read_ref(bb, b - bb, tmp.data() + (bb - a));
            } else {
              read_ref(a, u.raw, tmp.data());
            }
            tz::predict::xor_bytes(tmp.data(), raw, u.raw);
          }
          // An exact prediction: the chunk's residual is all zero and is
          // stored as a frame of size 0 (section 12.2), no codec call.
          const uint8_t* r = raw;
          uint64_t acc = 0;
          size_t k = 0;
          for (; k + 8 <= u.raw; k += 8) acc |= load_le64(r + k);
          for (; k < u.raw; ++k) acc |= r[k];
          if (acc == 0) {
            *comp_size = 0;
            *hash = XXH64(r, 0, 0);
            return;
          }
        }
        tz_params p{};
        p.dtype = u.seg->codec_dtype;
        p.level = u.seg->level;
        p.block_elems = u.seg->block_elems;
        p.threads = 1;
        const size_t r = tz_ctx_compress(ctx.v[w], dst, cap, raw, u.raw, &p);
        if (tz_is_error(r))
          fail(ErrorKind::kInternal, in + ": " + seg_label(*u.seg) + ": compression failed: " +
                                         tz_get_error_name(r) + " " + tz_last_error_detail());
        *comp_size = r;
        *hash = XXH64(dst, r, 0);
  };

  // Consecutive units, whose source bytes are contiguous (segments tile the
  // data section), are read, coded and written as groups.
  const std::vector<ItemGroup> groups = group_items(units.size(), [&](size_t i) { return units[i].raw; });
  auto raw_span = [&](const ItemGroup& g) {
    const Unit& z = units[g.first + g.count - 1];
    return z.src_off + z.raw - units[g.first].src_off;
  };
  auto comp_cap = [&](const ItemGroup& g) {
    uint64_t cap = 0;
    for (size_t k = 0; k < g.count; ++k) cap += tz_compress_bound(units[g.first + k].raw);
    return cap;
  };
  // Every slot's buffers are allocated once, at the largest group's size.
  uint64_t max_raw = 0, max_cap = 0;
  for (const ItemGroup& g : groups) max_raw = std::max(max_raw, raw_span(g)), max_cap = std::max(max_cap, comp_cap(g));
  // A group is read and coded by one worker (the reads' kernel copies run
  // in parallel too); its frames are written and hashed in order.
  run_pipeline(
      groups.size(), window, slots, workers, [](size_t, Slot&) {},
      [&](size_t gi, Slot& s, unsigned w) {
        const ItemGroup& g = groups[gi];
        const uint64_t n = raw_span(g);
        src.pread_exact(units[g.first].src_off, s.raw.reserve(n, max_raw), n);
        s.comp_off.resize(g.count);
        s.comp_size.resize(g.count);
        s.hash.resize(g.count);
        uint8_t* comp = s.comp.reserve(comp_cap(g), max_cap);
        // Frames are packed one after the other (each with its own bound
        // as room), so a group of small frames touches only the pages its
        // frames fill, not one page per frame.
        uint64_t at = 0;
        for (size_t k = 0; k < g.count; ++k) {
          const Unit& u = units[g.first + k];
          s.comp_off[k] = at;
          code_unit(u, s.raw.p.get() + (u.src_off - units[g.first].src_off), comp + at,
                    tz_compress_bound(u.raw), w, &s.comp_size[k], &s.hash[k]);
          at += s.comp_size[k];
        }
      },
      [&](size_t gi, Slot& s) {
        const ItemGroup& g = groups[gi];
        for (size_t k = 0; k < g.count; ++k) {
          Unit& u = units[g.first + k];
          pad();
          FrameRef f;
          f.offset = out.offset();
          f.size = s.comp_size[k];
          f.raw_size = u.raw;
          f.xxh64 = s.hash[k];
          emit(s.comp.p.get() + s.comp_off[k], s.comp_size[k]);
          u.seg->frames.push_back(f);
          done += u.raw;
        }
        if (opt.progress) opt.progress(done, st.file_size);
      });

  pad();
  const uint64_t header_offset = out.offset();
  const std::string json = encode_header(h);
  if (json.size() > kMaxHeaderBytes) fail_header_too_large(in, json.size());
  const std::string header = pack_header(json);
  emit(header.data(), header.size());
  uint8_t tr[kTrailerSize] = {};
  put_le64(tr + 0, header_offset);
  put_le64(tr + 8, header.size());
  put_le64(tr + 16, XXH64(header.data(), header.size(), 0));
  put_le16(tr + 24, h.major);
  put_le16(tr + 26, kTzipVersionMinor);
  emit(tr, kTrailerHashedSize);
  put_le64(tr + 32, XXH64_digest(fh));
  std::memcpy(tr + 44, kEndMagic, 4);
  out.write(tr + kTrailerHashedSize, kTrailerSize - kTrailerHashedSize);
  const uint64_t file_bytes = out.offset();
  out.commit();
  return PassStats{st.file_size, file_bytes};
}

}  // namespace tz::container

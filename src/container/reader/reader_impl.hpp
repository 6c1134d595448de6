// The Reader's state, shared by its sources: reader/reader.cpp (open, header,
// random access), reader/refs.cpp (references, predictions) and
// reader/pass.cpp (the whole-file pass of export and verify).
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "internal.hpp"
#include "file_io.hpp"
#include "file_refs.hpp"

namespace tz::container {

using namespace detail;

// A frame of the whole-file pass, and one item of its pipeline (a group of
// consecutive frames).
struct PassUnit {
  const TensorEntry* seg;
  size_t c;
  uint64_t read_from;  // previous frame end: padding is read (and checked) too
};
struct PassSlot {
  Buf comp{true}, raw{true};  // a group of frames as read (with the padding before each); their decoded bytes (huge pages)
  std::vector<uint64_t> raw_off;  // per frame, its place in raw (~0: decoded into the caller's memory)
  uint64_t produced = 0;          // bytes the group's frames decoded to
};

struct Reader::Impl {
  std::string path;
  std::unique_ptr<InFile> f;
  unsigned threads = 0;
  uint16_t minor = 0;
  uint64_t header_offset = 0;
  uint64_t header_size = 0;  // stored bytes (read again by pass(): no copy is kept)
  uint8_t trailer[kTrailerSize] = {};
  uint64_t file_hash = 0;
  uint64_t max_frame_size = 0;  // the largest frame's stored bytes (validated header): read buffers grow to it at once
  uint64_t header_hash = 0;  // trailer header_xxh64, equal to xxh64 of the stored header
  TzipHeader h;
  // References: the chain that led to this file (itself included), and
  // whether recorded paths may point anywhere (file_refs.hpp).
  refs::Chain chain;
  refs::Policy policy;
  // Opened as a reference whose identity is its verified header: each frame
  // is checked against the header's xxh64 on first use (frame_ok, indexed
  // by frame_base[tensor index] + frame).
  bool verify_frames = false;
  std::unique_ptr<std::atomic<uint8_t>[]> frame_ok;
  // Per tensor, the index of its frame 0 in the per-frame tables; per
  // tensor frame, where the padding before it starts (set at open).
  std::vector<size_t> frame_base;
  std::vector<uint64_t> pad_from;
  // Codec contexts for random-access reads, one per concurrent caller (the
  // read functions are thread-safe; export/verify workers read predictors),
  // each with the buffer its caller reads compressed bytes into: kept with
  // the context (at most the largest frame read so far, per context) so
  // that reading frame after frame does not allocate, and first-touch,
  // fresh memory for each one.
  struct PooledCtx {
    tz_ctx* c = nullptr;
    Buf comp;
    ~PooledCtx() { tz_ctx_free(c); }
  };
  std::mutex mu;
  std::vector<std::unique_ptr<PooledCtx>> pool;
  // References (section 12), opened on first use.
  std::vector<std::string> ref_paths;         // given or opened path per reference ("" until then)
  std::vector<std::unique_ptr<Reader>> refs;  // opened and checksum-checked
  struct Original {                           // verified export of a reference
    std::unique_ptr<InFile> f;
    SafetensorsInfo st;
    std::unordered_map<std::string, size_t> by_name;  // tensor name -> index in st.tensors
    bool verify = false;                      // check its bytes against the reference's block checksums
  };
  std::vector<std::unique_ptr<Original>> originals;
  // add_reference_paths: paths (with their checksums) not matching a direct
  // reference, passed on to each reference when it is opened.
  std::vector<std::pair<std::string, uint64_t>> chain_paths;
  std::vector<std::pair<std::string, uint64_t>> given_paths;  // all of them, checked by check_references

  // Uses each (path, checksum) for the direct reference it matches, else
  // keeps it for the references (opened ones get it now).
  void add_paths(const std::vector<std::pair<std::string, uint64_t>>& v) {
    std::vector<std::pair<std::string, uint64_t>> deeper;
    std::vector<bool> fresh(refs.size(), false);
    for (const auto& ps : v) {
      bool direct = false;
      for (size_t i = 0; i < h.references.size() && !direct; ++i)
        if (h.references[i].xxh64 == ps.second) {
          std::unique_ptr<Reader> rd = refs::open_reference(path, h.references[i], ps.first, policy, threads, chain);
          rd->impl_->policy = policy;
          std::lock_guard<std::mutex> lk(mu);
          ref_paths[i] = ps.first;
          refs[i] = std::move(rd);
          fresh[i] = true;
          direct = true;
        }
      if (!direct) deeper.push_back(ps);
    }
    chain_paths.insert(chain_paths.end(), deeper.begin(), deeper.end());
    for (size_t i = 0; i < refs.size(); ++i) {
      if (!refs[i]) continue;
      const auto& give = fresh[i] ? chain_paths : deeper;
      if (!give.empty()) refs[i]->impl_->add_paths(give);
    }
  }
  void pass_chain(Reader& rd) {
    if (!chain_paths.empty()) rd.impl_->add_paths(chain_paths);
  }
  // Checksums of every reference reachable from this file (opens them).
  void collect_sums(std::vector<uint64_t>* out);

  // A context and its buffer, most recently returned first; back to the
  // pool when the lease ends.
  struct CtxLease {
    Impl* m;
    std::unique_ptr<PooledCtx> p;
    tz_ctx* c;
    Buf& comp() { return p->comp; }
    CtxLease(Impl* impl, std::unique_ptr<PooledCtx> pc) : m(impl), p(std::move(pc)), c(p->c) {}
    CtxLease(const CtxLease&) = delete;
    CtxLease& operator=(const CtxLease&) = delete;
    ~CtxLease() {
      std::lock_guard<std::mutex> lk(m->mu);
      m->pool.push_back(std::move(p));
    }
  };
  CtxLease lease() {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!pool.empty()) {
        std::unique_ptr<PooledCtx> pc = std::move(pool.back());
        pool.pop_back();
        return CtxLease(this, std::move(pc));
      }
    }
    auto pc = std::make_unique<PooledCtx>();
    pc->c = tz_ctx_create(1);
    if (!pc->c) fail(ErrorKind::kInternal, path + ": cannot create a codec context (out of memory)");
    return CtxLease(this, std::move(pc));
  }

  Reader& reference(size_t i) {
    std::lock_guard<std::mutex> lk(mu);
    if (!refs[i]) {
      // Resolved (path rule), opened (regular file, non-blocking, chain) and
      // identified by the references module.
      std::unique_ptr<Reader> rd = refs::open_reference(path, h.references[i], "", policy, threads, chain);
      rd->impl_->policy = policy;
      pass_chain(*rd);
      ref_paths[i] = rd->path();
      refs[i] = std::move(rd);
    }
    return *refs[i];
  }
  // Path of reference i for messages: where it was opened, else as recorded.
  std::string ref_name(size_t i) const {
    return ref_paths[i].empty() ? dir_of(path) + "/" + h.references[i].file : ref_paths[i];
  }
  // Before frame c of tensor `index` is used by a partial read: with
  // verify_frames, its bytes must have the xxh64 the (verified) header
  // lists; checked once (reader/read_frame.cpp).
  void check_frame_on_use(const TensorEntry& t, size_t index, size_t c);

  // value = residual XOR prediction, for raw bytes [off, off+n) of t held in io.
  void apply_prediction(const TensorEntry& t, uint64_t off, uint8_t* io, uint64_t n);
  // The tensor at index (kUsage if out of range).
  const TensorEntry& tensor_at(size_t index) const {
    if (index >= h.tensors.size()) fail(ErrorKind::kUsage, path + ": tensor index out of range");
    return h.tensors[index];
  }
  // tensor_at(index), checking that bytes [offset, offset + size) lie in it; *end = offset + size.
  const TensorEntry& byte_range(size_t index, uint64_t offset, uint64_t size, uint64_t* end) const {
    const TensorEntry& t = tensor_at(index);
    if (!checked_add(offset, size, end) || *end > t.raw_size())
      fail(ErrorKind::kUsage, path + ": " + label(t) + ": byte range outside the tensor");
    return t;
  }
  void read_blocks_into(const TensorEntry& t, size_t index, uint64_t first, uint64_t count, uint8_t* out,
                        size_t capacity, size_t* written);
  std::string label(const TensorEntry& t) const {
    return t.is_gap ? "gap at data offset " + std::to_string(t.data_begin) : "tensor '" + t.name + "'";
  }
  [[noreturn]] void corrupt(const TensorEntry& t, const std::string& msg) const {
    fail(ErrorKind::kBadInput, path + ": " + label(t) + ": " + msg);
  }
  uint64_t blocks_per_chunk(const TensorEntry& t) const { return h.chunk_bytes / t.block_bytes(); }

  // ---- Reading a frame with its checks (reader/read_frame.cpp): the one
  // path of every reader (doc/container.md section 6, items 8 and 9). ----
  // At open: pad_from and frame_base; the padding after the preamble and
  // before the header is zero.
  void index_frames_and_check_padding();
  // Throws for the first non-zero byte of p[0, n), the file's bytes from
  // offset `at` (padding).
  void check_zero(const uint8_t* p, uint64_t n, uint64_t at) const;
  [[noreturn]] void padding_error(uint64_t at) const;
  // Frame c of t (its bytes at src) against the header's xxh64; on a
  // mismatch, the codec's per-block checksums name the damaged block.
  void check_frame_hash(tz_ctx* cx, const TensorEntry& t, size_t c, const uint8_t* src) const;
  void check_frame_info(const TensorEntry& t, size_t c, const tz_frame_info& info) const {
    if (info.dtype != t.codec_dtype || info.block_elems != t.block_elems || info.raw_size != t.frames[c].raw_size)
      corrupt(t, "frame " + std::to_string(c) + " does not match the header (data corrupted)");
  }
  // Decodes a whole frame in memory into dst (raw_size bytes): its xxh64
  // first, then its header against the table, then the codec (every
  // block's checksum) and the decoded size.
  void decode_frame(tz_ctx* cx, const TensorEntry& t, size_t c, const uint8_t* src, uint8_t* dst) const;
  // A whole frame of tensor `index` read (with the padding on both sides,
  // checked), checked and decoded into dst; no prediction applied. For
  // frames of size > 0.
  void read_frame(CtxLease& cx, const TensorEntry& t, size_t index, size_t c, uint8_t* dst);
  // The prefix of frame c of tensor `index` (the padding before it checked),
  // checked against the header: what partial reads start from.
  void read_prefix(const TensorEntry& t, size_t index, size_t c, std::vector<uint8_t>* prefix);
  // Where the zero padding before frame c of tensor `index` starts (the
  // previous frame's end, or 16), and after it ends.
  uint64_t padding_before(size_t index, size_t c) const { return pad_from[frame_base[index] + c]; }
  static uint64_t padding_end(const FrameRef& fr) { return align_up(fr.offset + fr.size); }

  // Reads, checks and decodes every frame; sink(bytes, n, data offset) gets
  // the decoded data section group by group: in order, or with
  // sink_any_order from the workers in any order (a thread-safe positional
  // writer).
  // dests (read_all): per tensor index, where its decoded bytes go (nullptr:
  // decoded into the slot's buffer and discarded, as gaps are).
  PassStats pass(const std::function<void(const uint8_t*, size_t, uint64_t)>& sink, const ReadOptions& opt,
                 bool sink_any_order = false, const std::vector<uint8_t*>* dests = nullptr);
  // max_raw_hint: the largest group's decoded size (s.raw grows to it at once).
  void decode_group(const PassUnit* units, size_t count, PassSlot& s, tz_ctx* cx, uint64_t max_raw_hint,
                    const std::vector<uint8_t*>* dests);
  static void apply_ref_options(Reader& self, const ReadOptions& opt);
};

}  // namespace tz::container

// .tzip reader: opening reads the preamble, trailer and header only; a tensor
// or a block range reads only its frames (pread). export/verify are one
// sequential pass that checks every byte of the file (doc/container.md,
// "Safe reading").
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "codec/checksum.h"
#include "codec/predict.h"
#include "cpu/checksum_cpu.h"

#include "tzc_internal.hpp"
#include "tzc_io.hpp"
#include "tzc_pipeline.hpp"
#include "tzip_refs.hpp"

namespace tz::container {

using namespace detail;


struct Reader::Impl {
  std::string path;
  std::unique_ptr<InFile> f;
  unsigned threads = 0;
  uint16_t minor = 0;
  uint64_t header_offset = 0;
  uint64_t header_size = 0;  // stored bytes (read again by pass(): no copy is kept)
  uint8_t trailer[kTrailerSize] = {};
  uint64_t file_hash = 0;
  uint64_t header_hash = 0;  // trailer header_xxh64, equal to xxh64 of the stored header
  TzipHeader h;
  // References: the chain that led to this file (itself included), and
  // whether recorded paths may point anywhere (tzip_refs.hpp).
  refs::Chain chain;
  refs::Policy policy;
  // Opened as a reference whose identity is its verified header: each frame
  // is checked against the header's xxh64 on first use (frame_ok, indexed
  // by frame_base[tensor index] + frame).
  bool verify_frames = false;
  std::vector<size_t> frame_base;
  std::unique_ptr<std::atomic<uint8_t>[]> frame_ok;
  // Codec contexts for random-access reads, one per concurrent caller (the
  // read functions are thread-safe; export/verify workers read predictors).
  std::mutex mu;
  std::vector<tz_ctx*> pool;
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

  ~Impl() {
    for (auto* c : pool) tz_ctx_free(c);
  }
  struct CtxLease {
    Impl* m;
    tz_ctx* c;
    ~CtxLease() {
      std::lock_guard<std::mutex> lk(m->mu);
      m->pool.push_back(c);
    }
  };
  CtxLease lease() {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!pool.empty()) {
        tz_ctx* c = pool.back();
        pool.pop_back();
        return CtxLease{this, c};
      }
    }
    tz_ctx* c = tz_ctx_create(1);
    if (!c) fail(ErrorKind::kInternal, path + ": cannot create a codec context (out of memory)");
    return CtxLease{this, c};
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
  // Before frame c of tensor `index` is used: with verify_frames, its bytes
  // must have the xxh64 the (verified) header lists; checked once.
  void check_frame_on_use(const TensorEntry& t, size_t index, size_t c) {
    if (!verify_frames || t.frames[c].size == 0) return;
    std::atomic<uint8_t>& ok = frame_ok[frame_base[index] + c];
    if (ok.load(std::memory_order_acquire)) return;
    const FrameRef& fr = t.frames[c];
    Buf b;
    uint8_t* p = b.reserve(fr.size);
    f->pread_exact(fr.offset, p, fr.size);
    if (XXH64(p, fr.size, 0) != fr.xxh64)
      corrupt(t, "frame " + std::to_string(c) + ": checksum mismatch (data corrupted)");
    ok.store(1, std::memory_order_release);
  }

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

  // Reads the prefix of frame c of t; checks it against the header.
  void read_prefix(const TensorEntry& t, size_t c, std::vector<uint8_t>* prefix) {
    const FrameRef& fr = t.frames[c];
    const size_t first = (size_t)std::min<uint64_t>(fr.size, 64 * 1024);
    prefix->resize(first);
    f->pread_exact(fr.offset, prefix->data(), first);
    const size_t ps = tz_frame_prefix_size(prefix->data(), prefix->size());
    if (tz_is_error(ps) || ps > fr.size)
      corrupt(t, "frame " + std::to_string(c) + " header: " + (tz_is_error(ps) ? tz_get_error_name(ps) : "too large") +
                     " (data corrupted)");
    if (ps > prefix->size()) {
      prefix->resize(ps);
      f->pread_exact(fr.offset + first, prefix->data() + first, ps - first);
    } else {
      prefix->resize(ps);
    }
    tz_frame_info info;
    const size_t r = tz_frame_inspect(prefix->data(), prefix->size(), &info);
    if (tz_is_error(r))
      corrupt(t, "frame " + std::to_string(c) + " header: " + tz_get_error_name(r) + " " + tz_last_error_detail() +
                     " (data corrupted)");
    check_frame_info(t, c, info);
  }

  void check_frame_info(const TensorEntry& t, size_t c, const tz_frame_info& info) const {
    if (info.dtype != t.codec_dtype || info.block_elems != t.block_elems || info.raw_size != t.frames[c].raw_size)
      corrupt(t, "frame " + std::to_string(c) + " does not match the header (data corrupted)");
  }

  // Decodes a whole frame already in memory (checks its xxh64 first).
  void decode_frame(tz_ctx* cx, const TensorEntry& t, size_t c, const uint8_t* src, uint8_t* dst) const {
    const FrameRef& fr = t.frames[c];
    const uint64_t bpc = blocks_per_chunk(t);
    if (XXH64(src, fr.size, 0) != fr.xxh64) {
      // Locate the damage: the codec's per-block checksums name the block.
      unsigned bad = 0;
      const size_t v = tz_ctx_verify(cx, src, fr.size, &bad);
      if (tz_is_error(v) && tz_get_error_code(v) != TZ_ERROR_CORRUPT_HEADER &&
          tz_get_error_code(v) != TZ_ERROR_BAD_MAGIC && tz_get_error_code(v) != TZ_ERROR_BAD_VERSION &&
          tz_get_error_code(v) != TZ_ERROR_SRC_TRUNCATED)
        corrupt(t, "block " + std::to_string(c * bpc + bad) + ": " + tz_get_error_name(v) + " (data corrupted)");
      corrupt(t, "frame " + std::to_string(c) + " (blocks " + std::to_string(c * bpc) + "..): checksum mismatch" +
                     (tz_is_error(v) ? std::string(" in frame header: ") + tz_get_error_name(v) : std::string()) +
                     " (data corrupted)");
    }
    size_t r;
    unsigned bad = 0;
    if (dst) {
      r = tz_ctx_decompress(cx, dst, fr.raw_size, src, fr.size);
      if (tz_is_error(r)) tz_ctx_verify(cx, src, fr.size, &bad);
    } else {
      r = tz_ctx_verify(cx, src, fr.size, &bad);
    }
    if (tz_is_error(r))
      corrupt(t, "block " + std::to_string(c * bpc + bad) + ": " + tz_get_error_name(r) + " (" + tz_last_error_detail() + ")");
    if (r != fr.raw_size) corrupt(t, "frame " + std::to_string(c) + " decodes to the wrong size (data corrupted)");
  }

  PassStats pass(const std::function<void(const uint8_t*, size_t, uint64_t)>& sink, const ReadOptions& opt);
  static void apply_ref_options(Reader& self, const ReadOptions& opt);
};

Reader::Reader(const std::string& path, unsigned threads) : Reader(path, threads, refs::Chain()) {}

Reader::Reader(const std::string& path, unsigned threads, const refs::Chain& via) : impl_(new Impl) {
  Impl& m = *impl_;
  m.path = path;
  m.threads = threads;
  m.f = std::make_unique<InFile>(path);
  // Before anything is read: a file already in the chain is a cycle.
  m.chain = via.then(path, m.f->status());
  const uint64_t size = m.f->size();
  uint8_t pre[kPreambleSize];
  if (size < kPreambleSize) {
    if (size >= 4 || size == 0) {
      uint8_t head[4] = {};
      if (size >= 4) m.f->pread_exact(0, head, 4);
      if (size == 0 || std::memcmp(head, kMagic, 4) != 0) fail(ErrorKind::kBadInput, path + ": not a .tzip file (bad magic)");
    }
    fail(ErrorKind::kBadInput, path + ": truncated .tzip file (" + std::to_string(size) + " bytes)");
  }
  m.f->pread_exact(0, pre, kPreambleSize);
  if (std::memcmp(pre, kMagic, 4) != 0) fail(ErrorKind::kBadInput, path + ": not a .tzip file (bad magic)");
  const uint16_t major = get_le16(pre + 4);
  m.minor = get_le16(pre + 6);
  if (major > kTzipMaxReadMajor)
    fail(ErrorKind::kBadInput, path + ": .tzip format version " + std::to_string(major) + "." + std::to_string(m.minor) +
                                   " is newer than this reader (reads versions up to " +
                                   std::to_string(kTzipMaxReadMajor) + "); upgrade tensorzip");
  if (major < 1) fail(ErrorKind::kBadInput, path + ": bad .tzip format version " + std::to_string(major));
  const uint32_t flags = get_le32(pre + 8);
  if ((flags & ~kFlagHeaderZstd) != 0 || get_le32(pre + 12) != 0)
    fail(ErrorKind::kBadInput, path + ": .tzip preamble has unknown flags set (a newer format?)");
  if (size < kAlign + kTrailerSize) fail(ErrorKind::kBadInput, path + ": truncated .tzip file (" + std::to_string(size) + " bytes)");
  m.f->pread_exact(size - kTrailerSize, m.trailer, kTrailerSize);
  const uint8_t* tr = m.trailer;
  if (std::memcmp(tr + 44, kEndMagic, 4) != 0 || get_le32(tr + 40) != 0)
    fail(ErrorKind::kBadInput, path + ": truncated or damaged .tzip file (no end marker)");
  m.header_offset = get_le64(tr + 0);
  const uint64_t hsize = get_le64(tr + 8);
  if (get_le16(tr + 24) != major || get_le16(tr + 26) != m.minor || get_le32(tr + 28) != 0)
    fail(ErrorKind::kBadInput, path + ": damaged .tzip trailer (version differs from the preamble)");
  uint64_t end;
  if (hsize > kMaxHeaderBytes) fail(ErrorKind::kBadInput, path + ": damaged .tzip trailer (header size " + std::to_string(hsize) + " over the limit)");
  if (!checked_add(m.header_offset, hsize, &end) || !checked_add(end, kTrailerSize, &end) || end != size ||
      m.header_offset < kAlign || m.header_offset % kAlign != 0)
    fail(ErrorKind::kBadInput, path + ": truncated or damaged .tzip file (header location does not match the file size)");
  m.header_size = hsize;
  {
    // The stored header, and its JSON, live only while it is parsed.
    std::string stored(hsize, '\0');
    m.f->pread_exact(m.header_offset, stored.data(), hsize);
    m.header_hash = get_le64(tr + 16);
    if (XXH64(stored.data(), hsize, 0) != m.header_hash)
      fail(ErrorKind::kBadInput, path + ": .tzip header checksum mismatch (header corrupted)");
    if (flags & kFlagHeaderZstd) {
      std::string json = unpack_header(reinterpret_cast<const uint8_t*>(stored.data()), stored.size(), path);
      std::string().swap(stored);
      decode_header(std::move(json), m.header_offset, major, path, &m.h);
    } else {
      decode_header(std::move(stored), m.header_offset, major, path, &m.h);
    }
  }
  m.file_hash = get_le64(tr + 32);
  m.ref_paths.resize(m.h.references.size());
  m.refs.resize(m.h.references.size());
  m.originals.resize(m.h.references.size());
}

std::unique_ptr<Reader> ReaderAccess::open(const std::string& path, unsigned threads, const refs::Chain& via) {
  return std::unique_ptr<Reader>(new Reader(path, threads, via));
}

void ReaderAccess::verify_frames_on_use(Reader& r) {
  Reader::Impl& m = *r.impl_;
  if (m.verify_frames) return;
  size_t n = 0;
  m.frame_base.resize(m.h.tensors.size());
  for (size_t i = 0; i < m.h.tensors.size(); ++i) m.frame_base[i] = n, n += m.h.tensors[i].frames.size();
  m.frame_ok.reset(new std::atomic<uint8_t>[n ? n : 1]());
  m.verify_frames = true;
}

void ReaderAccess::check_file_checksum(Reader& r) {
  Reader::Impl& m = *r.impl_;
  XXH64_state_t* st = XXH64_createState();
  if (!st) fail(ErrorKind::kInternal, "out of memory");
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> guard(st, &XXH64_freeState);
  XXH64_reset(st, 0);
  const uint64_t n = m.f->size() - (kTrailerSize - kTrailerHashedSize);
  Buf b;
  uint8_t* p = b.reserve(1 << 20);
  m.f->advise_sequential();
  for (uint64_t off = 0; off < n;) {
    const size_t k = (size_t)std::min<uint64_t>(1 << 20, n - off);
    m.f->pread_exact(off, p, k);
    XXH64_update(st, p, k);
    off += k;
  }
  if (XXH64_digest(st) != m.file_hash)
    fail(ErrorKind::kBadInput, m.path + ": whole-file checksum mismatch (the file is damaged or was changed)");
}

void Reader::add_reference_original(const std::string& tzip_path, const std::string& st_path) {
  Impl& m = *impl_;
  Reader ref(tzip_path, 1);
  const uint64_t sum = ref.file_checksum();
  for (size_t i = 0; i < m.h.references.size(); ++i)
    if (m.h.references[i].xxh64 == sum) {
      auto o = std::make_unique<Impl::Original>();
      o->st = read_safetensors_info(st_path);
      for (size_t k = 0; k < o->st.tensors.size(); ++k) o->by_name.emplace(o->st.tensors[k].name, k);
      o->f = std::make_unique<InFile>(st_path);
      if (o->st.header_bytes != ref.safetensors_header() || o->f->size() != ref.original_size())
        fail(ErrorKind::kUsage, st_path + ": is not the safetensors file " + tzip_path +
                                    " decodes to (header or size differs)");
      std::lock_guard<std::mutex> lk(m.mu);
      m.originals[i] = std::move(o);
    }
}

uint16_t Reader::version_major() const { return impl_->h.major; }
uint64_t Reader::file_checksum() const { return impl_->file_hash; }
uint64_t Reader::header_checksum() const { return impl_->header_hash; }
void Reader::allow_references_anywhere(bool allow) { impl_->policy.any_location = allow; }
const std::vector<Reference>& Reader::references() const { return impl_->h.references; }

void Reader::add_reference_path(const std::string& p) {
  Impl& m = *impl_;
  if (m.h.references.empty()) return;
  const uint64_t sum = Reader(p, 1).file_checksum();
  for (size_t i = 0; i < m.h.references.size(); ++i)
    if (m.h.references[i].xxh64 == sum) {
      std::unique_ptr<Reader> rd = refs::open_reference(m.path, m.h.references[i], p, m.policy, m.threads, m.chain);
      rd->impl_->policy = m.policy;
      std::lock_guard<std::mutex> lk(m.mu);
      m.ref_paths[i] = p;
      m.refs[i] = std::move(rd);
      return;
    }
  std::string names;
  for (const auto& r : m.h.references) names += (names.empty() ? "" : ", ") + r.file;
  fail(ErrorKind::kBadInput, m.path + ": " + p + " is not a reference of this file (it needs: " + names + ")");
}

void Reader::add_reference_paths(const std::vector<std::string>& paths) {
  Impl& m = *impl_;
  std::vector<std::pair<std::string, uint64_t>> v;
  for (const auto& p : paths) v.push_back({p, Reader(p, 1).file_checksum()});
  m.given_paths.insert(m.given_paths.end(), v.begin(), v.end());
  m.add_paths(v);
}

void Reader::Impl::collect_sums(std::vector<uint64_t>* out) {
  for (size_t i = 0; i < h.references.size(); ++i) {
    out->push_back(h.references[i].xxh64);
    if (!originals[i]) reference(i).impl_->collect_sums(out);
  }
}

void Reader::check_references() {
  for (size_t i = 0; i < impl_->h.references.size(); ++i)
    if (!impl_->originals[i]) impl_->reference(i).check_references();
  if (!impl_->given_paths.empty()) {
    std::vector<uint64_t> sums;
    impl_->collect_sums(&sums);
    for (const auto& gp : impl_->given_paths)
      if (std::find(sums.begin(), sums.end(), gp.second) == sums.end())
        fail(ErrorKind::kBadInput, impl_->path + ": " + gp.first + " is not a reference of this file or of its references");
  }
}

void Reader::Impl::apply_prediction(const TensorEntry& t, uint64_t off, uint8_t* io, uint64_t n) {
  if (t.predict.kind == PredictKind::kNone || n == 0) return;
  if (t.predict.ref >= 0 && originals[(size_t)t.predict.ref]) {
    // The reference's verified export: read the predictor bytes directly.
    const Original& o = *originals[(size_t)t.predict.ref];
    const std::string& sname = t.predict.kind == PredictKind::kCast ? t.predict.source : t.name;
    const TensorEntry* s = nullptr;
    if (const auto it = o.by_name.find(sname); it != o.by_name.end()) s = &o.st.tensors[it->second];
    const bool cast = t.predict.kind == PredictKind::kCast;
    if (!s || (cast ? (s->dtype != "F32" || s->shape != t.shape) : (s->dtype != t.dtype || s->shape != t.shape)))
      corrupt(t, "predictor tensor '" + sname + "' missing or of another dtype/shape in " + o.f->path());
    std::unique_ptr<uint8_t[]> scratch(new uint8_t[cast ? n * 2 : n]);  // not zero-filled
    uint8_t* tmp_p = scratch.get();
    o.f->pread_exact(o.st.data_start + s->data_begin + (cast ? off * 2 : off), tmp_p, cast ? n * 2 : n);
    if (o.verify) {
      Reader& rr = reference((size_t)t.predict.ref);
      const long ri = rr.find(sname);
      const uint64_t so = cast ? off * 2 : off, sn = cast ? n * 2 : n;
      const bool same = ri >= 0 && rr.check_bytes(
                                       (size_t)ri, so, sn,
                                       [&](uint64_t q, uint64_t len, uint8_t* dst) {
                                         o.f->pread_exact(o.st.data_start + s->data_begin + q, dst, len);
                                       },
                                       tmp_p);
      if (!same)
        fail(ErrorKind::kUsage, o.f->path() + ": tensor '" + sname + "' differs from " + ref_name((size_t)t.predict.ref) +
                                    " (block checksums): not the content of the reference");
    }
    if (cast)
      tz::predict::cast_xor(tmp_p, io, n / 2, t.dtype == "F16" ? tz::predict::kCastF16 : tz::predict::kCastBF16);
    else
      tz::predict::xor_bytes(tmp_p, io, n);
    return;
  }
  Reader* src_reader = nullptr;
  Impl* self_src = nullptr;
  if (t.predict.ref >= 0) src_reader = &reference((size_t)t.predict.ref);
  else self_src = this;
  const std::string& sname = t.predict.kind == PredictKind::kCast ? t.predict.source : t.name;
  const TensorEntry* s = nullptr;
  size_t sidx = 0;
  {
    const auto& list = self_src ? h.tensors : src_reader->tensors();
    long i = -1;
    if (self_src) {
      const auto it = h.by_name.find(sname);
      if (it != h.by_name.end()) i = (long)it->second;
    } else {
      i = src_reader->find(sname);
    }
    if (i >= 0) s = &list[(size_t)i], sidx = (size_t)i;
  }
  const std::string where = self_src ? path : ref_name((size_t)t.predict.ref);
  if (!s) corrupt(t, "predictor tensor '" + sname + "' not found in " + where);
  // Bytes [o, o + len) of the predictor tensor from another file: straight
  // into the buffer when they are whole blocks (no bounce copy).
  auto read_ref = [&](uint64_t o, uint64_t len, uint8_t* dst) {
    const uint64_t bb = s->block_bytes();
    if (o % bb == 0 && (len % bb == 0 || o + len == s->raw_size()))
      src_reader->read_blocks(sidx, o / bb, (len + bb - 1) / bb, dst, len);
    else
      src_reader->read_range(sidx, o, len, dst);
  };
  std::unique_ptr<uint8_t[]> tmp_buf;  // not zero-filled
  if (t.predict.kind == PredictKind::kCast) {
    if (s->dtype != "F32" || s->shape != t.shape)
      corrupt(t, "cast source '" + sname + "' in " + where + " is not an FP32 tensor of the same shape");
    tmp_buf.reset(new uint8_t[n * 2]);
    uint8_t* tmp = tmp_buf.get();
    if (self_src) {
      size_t w = 0;
      const uint64_t bb = s->block_bytes(), so = off * 2, se = so + n * 2;
      const uint64_t fb = so / bb, lb = (se - 1) / bb;
      std::vector<uint8_t> blk((lb - fb + 1) * bb);
      read_blocks_into(*s, sidx, fb, lb - fb + 1, blk.data(), blk.size(), &w);
      std::memcpy(tmp, blk.data() + (so - fb * bb), n * 2);
    } else {
      read_ref(off * 2, n * 2, tmp);
    }
    tz::predict::cast_xor(tmp, io, n / 2, t.dtype == "F16" ? tz::predict::kCastF16 : tz::predict::kCastBF16);
  } else {
    if (s->dtype != t.dtype || s->shape != t.shape)
      corrupt(t, "delta reference tensor in " + where + " has a different dtype or shape");
    // In pieces of whole blocks (about 1 MiB): each piece is decoded into a
    // buffer that stays in cache and XORed into io at once.
    const uint64_t bb = s->block_bytes();
    const uint64_t piece = off % bb == 0 ? std::max<uint64_t>(bb, (UINT64_C(1) << 20) / bb * bb) : n;
    tmp_buf.reset(new uint8_t[std::min(piece, n)]);
    for (uint64_t done = 0; done < n;) {
      const uint64_t len = std::min(piece, n - done);
      read_ref(off + done, len, tmp_buf.get());
      tz::predict::xor_bytes(tmp_buf.get(), io + done, len);
      done += len;
    }
  }
}

Reader::~Reader() = default;

const std::string& Reader::path() const { return impl_->path; }
uint64_t Reader::file_size() const { return impl_->f->size(); }
uint16_t Reader::version_minor() const { return impl_->minor; }
const std::vector<TensorEntry>& Reader::tensors() const { return impl_->h.tensors; }
const std::vector<TensorEntry>& Reader::gaps() const { return impl_->h.gaps; }
const std::map<std::string, std::string>& Reader::metadata() const { return impl_->h.metadata; }
const std::map<std::string, std::string>& Reader::user_metadata() const { return impl_->h.user_metadata; }
const std::string& Reader::safetensors_header() const { return impl_->h.safetensors_header; }
uint64_t Reader::data_size() const { return impl_->h.data_size; }
uint64_t Reader::original_size() const { return 8 + impl_->h.safetensors_header.size() + impl_->h.data_size; }
uint64_t Reader::chunk_bytes() const { return impl_->h.chunk_bytes; }
const std::string& Reader::created_by() const { return impl_->h.created_by; }

long Reader::find(const std::string& name) const {
  const auto it = impl_->h.by_name.find(name);
  return it == impl_->h.by_name.end() ? -1 : (long)it->second;
}

void Reader::read_tensor(size_t index, void* dst, size_t capacity) {
  Impl& m = *impl_;
  const TensorEntry& t = m.tensor_at(index);
  if (capacity < t.raw_size()) fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": destination too small");
  std::vector<uint8_t> buf;
  uint8_t* out = static_cast<uint8_t*>(dst);
  {
    auto cx = m.lease();
    for (size_t c = 0; c < t.frames.size(); ++c) {
      if (t.frames[c].size == 0) {  // all-zero residual chunk (section 12.2)
        std::memset(out + c * m.h.chunk_bytes, 0, t.frames[c].raw_size);
        continue;
      }
      buf.resize(t.frames[c].size);
      m.f->pread_exact(t.frames[c].offset, buf.data(), buf.size());
      m.decode_frame(cx.c, t, c, buf.data(), out + c * m.h.chunk_bytes);
    }
  }
  m.apply_prediction(t, 0, out, t.raw_size());
}

std::vector<uint8_t> Reader::read_tensor(const std::string& name) {
  const long i = find(name);
  if (i < 0) fail(ErrorKind::kUsage, impl_->path + ": no tensor named '" + name + "'");
  std::vector<uint8_t> v(impl_->h.tensors[i].raw_size());
  read_tensor((size_t)i, v.data(), v.size());
  return v;
}

size_t Reader::read_blocks(size_t index, uint64_t first, uint64_t count, void* dst, size_t capacity) {
  Impl& m = *impl_;
  const TensorEntry& t = m.tensor_at(index);
  uint64_t last;
  if (!checked_add(first, count, &last) || last > t.n_blocks())
    fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": block range outside the tensor");
  size_t written = 0;
  m.read_blocks_into(t, index, first, count, static_cast<uint8_t*>(dst), capacity, &written);
  return written;
}

void Reader::Impl::read_blocks_into(const TensorEntry& t, size_t index, uint64_t first, uint64_t count, uint8_t* out,
                                    size_t capacity, size_t* written_out) {
  Impl& m = *this;
  const uint64_t last = first + count;
  const uint64_t bpc = m.blocks_per_chunk(t);
  size_t written = 0;
  auto cx = m.lease();
  std::vector<uint8_t> prefix;
  Buf blocks;  // compressed bytes: not zero-filled
  for (uint64_t b = first; b < last;) {
    const uint64_t c = b / bpc;
    const uint64_t lf = b - c * bpc;
    const uint64_t lc = std::min(last, (c + 1) * bpc) - b;
    if (t.frames[c].size == 0) {  // all-zero residual chunk (section 12.2)
      const uint64_t bb = t.block_bytes();
      const uint64_t rsize = std::min((lf + lc) * bb, t.frames[c].raw_size) - lf * bb;
      if (capacity - written < rsize) fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": destination too small");
      std::memset(out + written, 0, rsize);
      written += rsize;
      b += lc;
      continue;
    }
    m.check_frame_on_use(t, index, c);
    m.read_prefix(t, c, &prefix);
    uint64_t off, size, roff, rsize;
    const size_t r = tz_frame_block_range(prefix.data(), prefix.size(), (unsigned)lf, (unsigned)lc, &off, &size, &roff, &rsize);
    if (tz_is_error(r) || off + size > t.frames[c].size)
      m.corrupt(t, "frame " + std::to_string(c) + " block index damaged (data corrupted)");
    if (capacity - written < rsize) fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": destination too small");
    uint8_t* const bp = blocks.reserve(size);
    m.f->pread_exact(t.frames[c].offset + off, bp, size);
    const size_t d = tz_ctx_decompress_blocks(cx.c, out + written, capacity - written, prefix.data(),
                                              prefix.size(), bp, size, (unsigned)lf, (unsigned)lc);
    if (tz_is_error(d))
      m.corrupt(t, "blocks " + std::to_string(b) + ".." + std::to_string(b + lc - 1) + ": " + tz_get_error_name(d) +
                       " (" + tz_last_error_detail() + ")");
    written += d;
    b += lc;
  }
  m.apply_prediction(t, first * t.block_bytes(), out, written);
  *written_out = written;
}

void Reader::read_range(size_t index, uint64_t offset, uint64_t size, void* dst) {
  Impl& m = *impl_;
  uint64_t end;
  const TensorEntry& t = m.byte_range(index, offset, size, &end);
  if (size == 0) return;
  const uint64_t bb = t.block_bytes();
  const uint64_t fb = offset / bb, lb = (end - 1) / bb;
  std::vector<uint8_t> tmp((lb - fb + 1) * bb);
  read_blocks(index, fb, lb - fb + 1, tmp.data(), tmp.size());
  std::memcpy(dst, tmp.data() + (offset - fb * bb), size);
}

bool Reader::check_bytes(size_t index, uint64_t offset, uint64_t size,
                         const std::function<void(uint64_t, uint64_t, uint8_t*)>& read, const uint8_t* bytes) {
  Impl& m = *impl_;
  uint64_t end;
  const TensorEntry& t = m.byte_range(index, offset, size, &end);
  if (size == 0) return true;
  const uint64_t bb = t.block_bytes();
  const uint64_t fb = offset / bb, lb = (end - 1) / bb;  // covering blocks
  const uint64_t a = fb * bb, z = std::min((lb + 1) * bb, t.raw_size());
  std::unique_ptr<uint8_t[]> own;
  const uint8_t* data = bytes;  // [a, z)
  if (!bytes || a != offset || z != end) {
    own.reset(new uint8_t[z - a]);
    read(a, z - a, own.get());
    data = own.get();
  }
  if (t.predict.kind != PredictKind::kNone) {  // checksums cover the residual: decode
    std::unique_ptr<uint8_t[]> dec(new uint8_t[z - a]);
    size_t w = 0;
    m.read_blocks_into(t, index, fb, lb - fb + 1, dec.get(), z - a, &w);
    return w == z - a && std::memcmp(dec.get(), data, z - a) == 0;
  }
  const uint64_t bpc = m.blocks_per_chunk(t);
  std::vector<uint8_t> prefix;
  for (uint64_t b = fb; b <= lb;) {
    const uint64_t c = b / bpc;
    const FrameRef& fr = t.frames[c];
    m.check_frame_on_use(t, index, c);
    m.read_prefix(t, c, &prefix);
    for (; b <= lb && b < (c + 1) * bpc; ++b) {
      const unsigned lf = (unsigned)(b - c * bpc);
      uint64_t boff, bsize, roff, rsize;
      const size_t r = tz_frame_block_range(prefix.data(), prefix.size(), lf, 1, &boff, &bsize, &roff, &rsize);
      if (tz_is_error(r) || bsize < 4 || boff + bsize > fr.size)
        m.corrupt(t, "frame " + std::to_string(c) + " block index damaged (data corrupted)");
      uint8_t word[4];
      m.f->pread_exact(fr.offset + boff, word, 4);
      const uint8_t* p = data + (b * bb - a);
      if (b * bb + rsize > z) return false;
      if ((tz::cpu::block_checksum(p, rsize) ^ tz::block_checksum_salt(lf)) != get_le32(word)) return false;
    }
  }
  return true;
}

namespace {
struct PassUnit {
  const TensorEntry* seg;
  size_t c;
  uint64_t read_from;  // previous frame end: padding is read (and checked) too
};
struct PassSlot {
  Buf comp, raw;  // a group of frames as read (with the padding before each); their decoded bytes
  std::vector<uint64_t> raw_off;
};
}  // namespace

PassStats Reader::Impl::pass(const std::function<void(const uint8_t*, size_t, uint64_t)>& sink,
                             const ReadOptions& opt) {
  std::vector<PassUnit> units;
  uint64_t pos = kPreambleSize;
  for (const TensorEntry* s : h.segments)
    for (size_t c = 0; c < s->frames.size(); ++c) {
      units.push_back(PassUnit{s, c, pos});
      pos = s->frames[c].offset + s->frames[c].size;
    }
  XXH64_state_t* fh = XXH64_createState();
  if (!fh) fail(ErrorKind::kInternal, "out of memory");
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> guard(fh, &XXH64_freeState);
  XXH64_reset(fh, 0);
  uint8_t pre[kPreambleSize];
  f->pread_exact(0, pre, kPreambleSize);
  XXH64_update(fh, pre, kPreambleSize);
  f->advise_sequential();

  auto check_pad = [&](const uint8_t* p, size_t n, const std::string& where) {
    for (size_t i = 0; i < n; ++i)
      if (p[i] != 0) fail(ErrorKind::kBadInput, path + ": non-zero padding byte " + where + " (data corrupted)");
  };

  const unsigned workers = resolve_threads(opt.threads);
  CtxSet ctxs(workers);
  std::vector<PassSlot> slots(workers + 3);
  // verify is this pass with a null sink: every frame is decoded and every
  // prediction applied (references read, predictors checked) exactly as for
  // an export, so both fail on the same input with the same message.
  uint64_t done = 8 + h.safetensors_header.size();
  const uint64_t total = done + h.data_size;
  if (opt.progress) opt.progress(done, total);
  // Consecutive frames are contiguous in the file: read, decoded and passed
  // on as groups (one hand-off between threads per group).
  const std::vector<ItemGroup> groups =
      group_items(units.size(), [&](size_t i) { return units[i].seg->frames[units[i].c].raw_size; });
  auto frame_of = [&](const PassUnit& u) -> const FrameRef& { return u.seg->frames[u.c]; };
  run_pipeline(
      groups.size(), slots, workers,
      [&](size_t gi, PassSlot& s) {
        const ItemGroup& g = groups[gi];
        const uint64_t base = units[g.first].read_from;
        const FrameRef& last = frame_of(units[g.first + g.count - 1]);
        const uint64_t n = last.offset + last.size - base;
        uint8_t* p = s.comp.reserve(n);
        f->pread_exact(base, p, n);
        for (size_t k = 0; k < g.count; ++k) {
          const PassUnit& u = units[g.first + k];
          check_pad(p + (u.read_from - base), frame_of(u).offset - u.read_from, "before " + label(*u.seg));
        }
        XXH64_update(fh, p, n);
      },
      [&](size_t gi, PassSlot& s, unsigned w) {
        const ItemGroup& g = groups[gi];
        const uint64_t base = units[g.first].read_from;
        s.raw_off.resize(g.count);
        uint64_t raw_n = 0;
        for (size_t k = 0; k < g.count; ++k) s.raw_off[k] = raw_n, raw_n += frame_of(units[g.first + k]).raw_size;
        uint8_t* raw = s.raw.reserve(raw_n);
        for (size_t k = 0; k < g.count; ++k) {
          const PassUnit& u = units[g.first + k];
          const FrameRef& fr = frame_of(u);
          const uint8_t* src = s.comp.p.get() + (fr.offset - base);
          uint8_t* dst = raw + s.raw_off[k];
          if (fr.size == 0) {  // all-zero residual chunk (section 12.2)
            std::memset(dst, 0, fr.raw_size);
            apply_prediction(*u.seg, u.c * h.chunk_bytes, dst, fr.raw_size);
            continue;
          }
          tz_frame_info info;
          const size_t r = tz_frame_inspect(src, fr.size, &info);
          if (tz_is_error(r)) {
            decode_frame(ctxs.v[w], *u.seg, u.c, src, nullptr);  // names the damage
            corrupt(*u.seg, std::string("frame header: ") + tz_get_error_name(r) + " (data corrupted)");
          }
          check_frame_info(*u.seg, u.c, info);
          decode_frame(ctxs.v[w], *u.seg, u.c, src, dst);
          apply_prediction(*u.seg, u.c * h.chunk_bytes, dst, fr.raw_size);
        }
      },
      [&](size_t gi, PassSlot& s) {
        const ItemGroup& g = groups[gi];
        for (size_t k = 0; k < g.count; ++k) {
          const PassUnit& u = units[g.first + k];
          const FrameRef& fr = frame_of(u);
          if (sink) sink(s.raw.p.get() + s.raw_off[k], fr.raw_size, u.seg->data_begin + u.c * h.chunk_bytes);
          done += fr.raw_size;
        }
        if (opt.progress) opt.progress(done, total);
      });
  // The same check for verify and export: the frames produced exactly the
  // data section the header declares.
  if (done != total)
    fail(ErrorKind::kBadInput, path + ": frames decode to " + std::to_string(done - (total - h.data_size)) +
                                   " bytes of data, the header declares " + std::to_string(h.data_size) +
                                   " (data corrupted)");
  slots.clear();
  // Padding before the header, the header and the hashed part of the trailer.
  const uint64_t pad_n = header_offset - pos;
  std::vector<uint8_t> padbuf(pad_n);
  f->pread_exact(pos, padbuf.data(), pad_n);
  check_pad(padbuf.data(), pad_n, "before the header");
  XXH64_update(fh, padbuf.data(), pad_n);
  {
    std::vector<uint8_t>().swap(padbuf);
    Buf hb;
    uint8_t* hp = hb.reserve((size_t)std::min<uint64_t>(header_size, 1 << 20));
    for (uint64_t off = 0; off < header_size;) {
      const size_t k = (size_t)std::min<uint64_t>(1 << 20, header_size - off);
      f->pread_exact(header_offset + off, hp, k);
      XXH64_update(fh, hp, k);
      off += k;
    }
  }
  XXH64_update(fh, trailer, kTrailerHashedSize);
  if (XXH64_digest(fh) != file_hash)
    fail(ErrorKind::kBadInput, path + ": whole-file checksum mismatch (the trailer is damaged)");
  return PassStats{total, f->size()};
}

void Reader::Impl::apply_ref_options(Reader& self, const ReadOptions& opt) {
  if (opt.any_reference_location) self.impl_->policy.any_location = true;
  if (!opt.ref_originals.empty() && opt.ref_originals.size() != opt.refs.size())
    fail(ErrorKind::kUsage, "reference originals: give one per reference file (--ref-original pairs with --ref)");
  if (!opt.refs.empty()) self.add_reference_paths(opt.refs);
  for (size_t i = 0; i < opt.ref_originals.size(); ++i) {
    if (opt.ref_originals[i].empty()) continue;
    self.add_reference_original(opt.refs[i], opt.ref_originals[i]);
    // Given by the caller: every predictor range read from it is checked
    // against the reference's block checksums (apply_prediction).
    Impl& m = *self.impl_;
    const uint64_t sum = Reader(opt.refs[i], 1).file_checksum();
    for (size_t k = 0; k < m.h.references.size(); ++k)
      if (m.h.references[k].xxh64 == sum && m.originals[k]) m.originals[k]->verify = true;
  }
}

PassStats Reader::export_safetensors(const std::string& out_path, const ReadOptions& opt) {
  Impl& m = *impl_;
  m.apply_ref_options(*this, opt);
  check_references();
  check_not_same_file(m.path, out_path);
  OutFile out(out_path, opt.force);
  uint8_t len[8];
  put_le64(len, m.h.safetensors_header.size());
  out.write(len, 8);
  out.write(m.h.safetensors_header.data(), m.h.safetensors_header.size());
  const PassStats st = m.pass([&](const uint8_t* p, size_t n, uint64_t) { out.write(p, n); }, opt);
  if (out.offset() != original_size()) fail(ErrorKind::kInternal, out_path + ": exported size differs from the original");
  out.commit();
  return st;
}

PassStats Reader::verify(const std::string& original, const ReadOptions& opt) {
  Impl& m = *impl_;
  m.apply_ref_options(*this, opt);
  check_references();
  if (original.empty()) return m.pass(nullptr, opt);
  InFile orig(original);
  orig.advise_sequential();
  if (orig.size() != original_size())
    fail(ErrorKind::kBadInput, m.path + ": differs from " + original + " (sizes " + std::to_string(original_size()) +
                                   " and " + std::to_string(orig.size()) + ")");
  std::vector<uint8_t> buf(std::max<size_t>(8 + m.h.safetensors_header.size(), 1));
  orig.pread_exact(0, buf.data(), 8 + m.h.safetensors_header.size());
  uint8_t len[8];
  put_le64(len, m.h.safetensors_header.size());
  if (std::memcmp(buf.data(), len, 8) != 0 ||
      std::memcmp(buf.data() + 8, m.h.safetensors_header.data(), m.h.safetensors_header.size()) != 0)
    fail(ErrorKind::kBadInput, m.path + ": differs from " + original + " in the safetensors header");
  const uint64_t base = 8 + m.h.safetensors_header.size();
  return m.pass(
      [&](const uint8_t* p, size_t n, uint64_t data_off) {
        buf.resize(n);
        orig.pread_exact(base + data_off, buf.data(), n);
        if (std::memcmp(buf.data(), p, n) != 0) {
          size_t k = 0;
          while (buf[k] == p[k]) ++k;
          fail(ErrorKind::kBadInput, m.path + ": differs from " + original + " at byte " + std::to_string(base + data_off + k));
        }
      },
      opt);
}

}  // namespace tz::container

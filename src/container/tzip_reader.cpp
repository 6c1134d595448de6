// .tzip reader: opening reads the preamble, trailer and header only; a tensor
// or a block range reads only its frames (pread). export/verify are one
// sequential pass that checks every byte of the file (doc/container.md,
// "Safe reading").
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "tzc_internal.hpp"
#include "tzc_io.hpp"
#include "tzc_pipeline.hpp"

namespace tz::container {

using namespace detail;


struct Reader::Impl {
  std::string path;
  std::unique_ptr<InFile> f;
  unsigned threads = 0;
  uint16_t minor = 0;
  uint64_t header_offset = 0;
  std::string header;       // raw bytes
  uint8_t trailer[kTrailerSize] = {};
  uint64_t file_hash = 0;
  TzipHeader h;
  tz_ctx* ctx = nullptr;

  ~Impl() {
    if (ctx) tz_ctx_free(ctx);
  }
  tz_ctx* context() {
    if (!ctx) {
      ctx = tz_ctx_create(threads);
      if (!ctx) fail(ErrorKind::kInternal, path + ": cannot create a codec context (out of memory)");
    }
    return ctx;
  }
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
};

Reader::Reader(const std::string& path, unsigned threads) : impl_(new Impl) {
  Impl& m = *impl_;
  m.path = path;
  m.threads = threads;
  m.f = std::make_unique<InFile>(path);
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
  if (major > kTzipVersionMajor)
    fail(ErrorKind::kBadInput, path + ": .tzip format version " + std::to_string(major) + "." + std::to_string(m.minor) +
                                   " is newer than this reader (reads version " + std::to_string(kTzipVersionMajor) +
                                   "); upgrade tensorzip");
  if (major != kTzipVersionMajor) fail(ErrorKind::kBadInput, path + ": bad .tzip format version " + std::to_string(major));
  if (get_le32(pre + 8) != 0 || get_le32(pre + 12) != 0)
    fail(ErrorKind::kBadInput, path + ": .tzip preamble has unknown flags set");
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
  m.header.resize(hsize);
  m.f->pread_exact(m.header_offset, m.header.data(), hsize);
  if (XXH64(m.header.data(), hsize, 0) != get_le64(tr + 16))
    fail(ErrorKind::kBadInput, path + ": .tzip header checksum mismatch (header corrupted)");
  m.file_hash = get_le64(tr + 32);
  decode_header(m.header.data(), hsize, m.header_offset, path, &m.h);
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
  const auto& t = impl_->h.tensors;
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].name == name) return (long)i;
  return -1;
}

void Reader::read_tensor(size_t index, void* dst, size_t capacity) {
  Impl& m = *impl_;
  if (index >= m.h.tensors.size()) fail(ErrorKind::kUsage, m.path + ": tensor index out of range");
  const TensorEntry& t = m.h.tensors[index];
  if (capacity < t.raw_size()) fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": destination too small");
  std::vector<uint8_t> buf;
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (size_t c = 0; c < t.frames.size(); ++c) {
    buf.resize(t.frames[c].size);
    m.f->pread_exact(t.frames[c].offset, buf.data(), buf.size());
    m.decode_frame(m.context(), t, c, buf.data(), out + c * m.h.chunk_bytes);
  }
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
  if (index >= m.h.tensors.size()) fail(ErrorKind::kUsage, m.path + ": tensor index out of range");
  const TensorEntry& t = m.h.tensors[index];
  uint64_t last;
  if (!checked_add(first, count, &last) || last > t.n_blocks())
    fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": block range outside the tensor");
  const uint64_t bpc = m.blocks_per_chunk(t);
  uint8_t* out = static_cast<uint8_t*>(dst);
  size_t written = 0;
  std::vector<uint8_t> prefix, blocks;
  for (uint64_t b = first; b < last;) {
    const uint64_t c = b / bpc;
    const uint64_t lf = b - c * bpc;
    const uint64_t lc = std::min(last, (c + 1) * bpc) - b;
    m.read_prefix(t, c, &prefix);
    uint64_t off, size, roff, rsize;
    const size_t r = tz_frame_block_range(prefix.data(), prefix.size(), (unsigned)lf, (unsigned)lc, &off, &size, &roff, &rsize);
    if (tz_is_error(r) || off + size > t.frames[c].size)
      m.corrupt(t, "frame " + std::to_string(c) + " block index damaged (data corrupted)");
    if (capacity - written < rsize) fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": destination too small");
    blocks.resize(size);
    m.f->pread_exact(t.frames[c].offset + off, blocks.data(), size);
    const size_t d = tz_ctx_decompress_blocks(m.context(), out + written, capacity - written, prefix.data(),
                                              prefix.size(), blocks.data(), size, (unsigned)lf, (unsigned)lc);
    if (tz_is_error(d))
      m.corrupt(t, "blocks " + std::to_string(b) + ".." + std::to_string(b + lc - 1) + ": " + tz_get_error_name(d) +
                       " (" + tz_last_error_detail() + ")");
    written += d;
    b += lc;
  }
  return written;
}

void Reader::read_range(size_t index, uint64_t offset, uint64_t size, void* dst) {
  Impl& m = *impl_;
  if (index >= m.h.tensors.size()) fail(ErrorKind::kUsage, m.path + ": tensor index out of range");
  const TensorEntry& t = m.h.tensors[index];
  uint64_t end;
  if (!checked_add(offset, size, &end) || end > t.raw_size())
    fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": byte range outside the tensor");
  if (size == 0) return;
  const uint64_t bb = t.block_bytes();
  const uint64_t fb = offset / bb, lb = (end - 1) / bb;
  std::vector<uint8_t> tmp((lb - fb + 1) * bb);
  read_blocks(index, fb, lb - fb + 1, tmp.data(), tmp.size());
  std::memcpy(dst, tmp.data() + (offset - fb * bb), size);
}

namespace {
struct PassUnit {
  const TensorEntry* seg;
  size_t c;
  uint64_t read_from;  // previous frame end: padding is read (and checked) too
};
struct PassSlot {
  Buf comp, raw;
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
  const bool want_data = (bool)sink;
  uint64_t done = 8 + h.safetensors_header.size();
  const uint64_t total = done + h.data_size;
  if (opt.progress) opt.progress(done, total);
  run_pipeline(
      units.size(), slots, workers,
      [&](size_t i, PassSlot& s) {
        const PassUnit& u = units[i];
        const FrameRef& fr = u.seg->frames[u.c];
        const uint64_t n = fr.offset + fr.size - u.read_from;
        uint8_t* p = s.comp.reserve(n);
        f->pread_exact(u.read_from, p, n);
        check_pad(p, fr.offset - u.read_from, "before " + label(*u.seg));
        XXH64_update(fh, p, n);
      },
      [&](size_t i, PassSlot& s, unsigned w) {
        const PassUnit& u = units[i];
        const FrameRef& fr = u.seg->frames[u.c];
        const uint8_t* src = s.comp.p.get() + (fr.offset - u.read_from);
        tz_frame_info info;
        const size_t r = tz_frame_inspect(src, fr.size, &info);
        if (tz_is_error(r)) {
          decode_frame(ctxs.v[w], *u.seg, u.c, src, nullptr);  // names the damage
          corrupt(*u.seg, std::string("frame header: ") + tz_get_error_name(r) + " (data corrupted)");
        }
        check_frame_info(*u.seg, u.c, info);
        decode_frame(ctxs.v[w], *u.seg, u.c, src, want_data ? s.raw.reserve(fr.raw_size) : nullptr);
      },
      [&](size_t i, PassSlot& s) {
        const PassUnit& u = units[i];
        const FrameRef& fr = u.seg->frames[u.c];
        if (want_data) sink(s.raw.p.get(), fr.raw_size, u.seg->data_begin + u.c * h.chunk_bytes);
        done += fr.raw_size;
        if (opt.progress) opt.progress(done, total);
      });
  slots.clear();
  // Padding before the header, the header and the hashed part of the trailer.
  const uint64_t pad_n = header_offset - pos;
  std::vector<uint8_t> padbuf(pad_n);
  f->pread_exact(pos, padbuf.data(), pad_n);
  check_pad(padbuf.data(), pad_n, "before the header");
  XXH64_update(fh, padbuf.data(), pad_n);
  XXH64_update(fh, header.data(), header.size());
  XXH64_update(fh, trailer, kTrailerHashedSize);
  if (XXH64_digest(fh) != file_hash)
    fail(ErrorKind::kBadInput, path + ": whole-file checksum mismatch (the trailer is damaged)");
  return PassStats{total, f->size()};
}

PassStats Reader::export_safetensors(const std::string& out_path, const ReadOptions& opt) {
  Impl& m = *impl_;
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

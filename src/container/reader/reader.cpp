// .tzip reader: opening reads the preamble, trailer and header only; a tensor
// or a block range reads only its frames (pread). References are in
// reader/refs.cpp, the whole-file pass (export, verify) in
// reader/pass.cpp (doc/container.md, "Safe reading").
#include "codec/checksum.h"
#include "cpu/checksum_cpu.h"
#include "reader/reader_impl.hpp"

namespace tz::container {

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
  m.index_frames_and_check_padding();
  for (const auto* list : {&m.h.tensors, &m.h.gaps})
    for (const TensorEntry& t : *list)
      for (const FrameRef& fr : t.frames) m.max_frame_size = std::max(m.max_frame_size, fr.size);
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
  const size_t n = m.pad_from.size();  // tensor frames
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

uint16_t Reader::version_major() const { return impl_->h.major; }
uint64_t Reader::file_checksum() const { return impl_->file_hash; }
uint64_t Reader::header_checksum() const { return impl_->header_hash; }
void Reader::allow_references_anywhere(bool allow) { impl_->policy.any_location = allow; }
const std::vector<Reference>& Reader::references() const { return impl_->h.references; }

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
  uint8_t* out = static_cast<uint8_t*>(dst);
  {
    auto cx = m.lease();
    for (size_t c = 0; c < t.frames.size(); ++c) {
      if (t.frames[c].size == 0)  // all-zero residual chunk (section 12.2)
        std::memset(out + c * m.h.chunk_bytes, 0, t.frames[c].raw_size);
      else
        m.read_frame(cx, t, index, c, out + c * m.h.chunk_bytes);
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
  Buf& blocks = cx.comp();  // compressed bytes: not zero-filled, kept with the context
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
    m.read_prefix(t, index, c, &prefix);  // checks the padding before the frame
    uint64_t off, size, roff, rsize;
    const size_t r = tz_frame_block_range(prefix.data(), prefix.size(), (unsigned)lf, (unsigned)lc, &off, &size, &roff, &rsize);
    const FrameRef& fr = t.frames[c];
    if (tz_is_error(r) || off + size > fr.size)
      m.corrupt(t, "frame " + std::to_string(c) + " block index damaged (data corrupted)");
    if (capacity - written < rsize) fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": destination too small");
    // Blocks up to the frame's end: the padding after it is read and checked too.
    const uint64_t tail = off + size == fr.size ? m.padding_end(fr) - (fr.offset + fr.size) : 0;
    uint8_t* const bp = blocks.reserve(size + tail, m.max_frame_size + kAlign);
    m.f->pread_exact(fr.offset + off, bp, size + tail);
    m.check_zero(bp + size, tail, fr.offset + fr.size);
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
    m.read_prefix(t, index, c, &prefix);
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

}  // namespace tz::container

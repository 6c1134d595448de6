// TensorWriter: a .tzip file from named tensors in memory (container.hpp).
//
// Tensors are cut into chunk_bytes chunks, coded and written in order by
// write_frames (tzip_tensor_frames.cpp: `threads` threads in all, memory
// bounded by `slots` chunks); this file builds the tensor table, finds the
// predicted tensors, opens the output (O_DIRECT where asked and allowed) and
// writes the header and trailer.
//
// Layout written (doc/container.md sections 2-3, 11): preamble, frames (each
// at a multiple of 64), header JSON, trailer; built under a temporary name,
// fsync'd and renamed.
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "codec/predict.h"
#include "tzc_internal.hpp"
#include "tzc_io.hpp"
#include "tzc_predict.hpp"
#include "tzc_tensor_frames.hpp"
#include "write_queue.hpp"
#include "io/writeback.hpp"

namespace tz::container {

using namespace detail;

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kDirectAlign = 4096;

class PwriteSink final : public Sink {
 public:
  // writeback: start each chunk's writeback as it is written (tz::io::Writeback;
  // buffered files, which the writer fsyncs at the end).
  PwriteSink(int fd, bool writeback) : fd_(fd), writeback_(writeback) {}
  void write(uint64_t off, const void* p, size_t n, std::function<void()> done) override {
    if (!err_) err_ = tz::io::pwrite_full(fd_, p, n, off);
    if (!err_ && writeback_) started_.written_to(fd_, off + n);
    if (done) done();
  }
  int drain() override { return err_; }
  int error() const override { return err_; }
  std::string name() const override { return "pwrite"; }

 private:
  int fd_;
  bool writeback_;
  tz::io::Writeback started_;
  int err_ = 0;
};

// Discovery follows compress_file (tzip_writer.cpp) with the shared rules
// of tzc_predict.hpp, on memory. Cast: find_cast_source (a 64-element probe,
// then the residual's cost on a sample against min_gain), stopping at the
// first candidate exact on the probe. Delta (TensorWriterOptions::ref): the tensor of the same
// name, dtype and shape in the reference, sampled on one decoded block.

using Src = WriterSource;
using Item = WriterItem;
using Unit = WriterUnit;

}  // namespace

std::unique_ptr<Sink> make_pwrite_sink(int fd, bool direct) { return std::make_unique<PwriteSink>(fd, !direct); }

namespace {
// TensorWriterOptions::safetensors_header: the given header must describe the added tensors
// exactly (and nothing else), with `metadata` as its __metadata__.
void check_given_header(const std::string& hdr, const std::vector<Item>& items,
                        const std::map<std::string, std::string>& metadata, uint64_t data_size,
                        const std::string& path) {
  const std::string what = path + ": given safetensors header";
  SafetensorsInfo info;
  try {
    info = parse_safetensors_header(reinterpret_cast<const uint8_t*>(hdr.data()), hdr.size(),
                                    8 + (uint64_t)hdr.size() + data_size, what);
  } catch (const Error& e) {
    fail(ErrorKind::kUsage, e.what());
  }
  if (info.tensors.size() != items.size())
    fail(ErrorKind::kUsage, what + " holds " + std::to_string(info.tensors.size()) + " tensors, " +
                                std::to_string(items.size()) + " were added");
  std::map<std::string, const TensorEntry*> by_name;
  for (const auto& t : info.tensors) by_name[t.name] = &t;
  for (const auto& it : items) {
    const auto f = by_name.find(it.e.name);
    if (f == by_name.end()) fail(ErrorKind::kUsage, what + " has no tensor '" + it.e.name + "'");
    const TensorEntry& t = *f->second;
    if (t.dtype != it.e.dtype || t.shape != it.e.shape || t.data_begin != it.e.data_begin ||
        t.data_end != it.e.data_end)
      fail(ErrorKind::kUsage, what + ": tensor '" + it.e.name + "' differs from the added one (dtype, shape or "
                                     "data offsets)");
  }
  if (info.metadata != metadata) fail(ErrorKind::kUsage, what + ": __metadata__ differs from the writer's metadata");
}
}  // namespace

struct TensorWriter::Impl {
  std::string path;
  Temporary tmp;  // the file being written, beside `path`
  int fd = -1;
  TensorWriterOptions opt;
  std::vector<Item> items;
  std::map<std::string, size_t> by_name;
  uint64_t data_size = 0;
  std::vector<TensorEntry> out;
  enum { kOpen, kFinished, kAborted } state = kOpen;

  void remove_tmp() {
    if (fd >= 0) ::close(fd), fd = -1;
    tmp.remove();
  }
  Item& add_common(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
                   uint64_t size, int level, unsigned block_elems);
  TensorWriterStats finish();
};

TensorWriter::TensorWriter(const std::string& path, const TensorWriterOptions& opt) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.path = path;
  m.opt = opt;
  if (opt.chunk_bytes < kMinChunkBytes || opt.chunk_bytes > kMaxChunkBytes || (opt.chunk_bytes & (opt.chunk_bytes - 1)))
    fail(ErrorKind::kUsage, path + ": chunk size must be a power of two between 1 MiB and 64 MiB");
  if (opt.block_elems &&
      (opt.block_elems < 4096 || opt.block_elems > (1u << 20) || (opt.block_elems & (opt.block_elems - 1))))
    fail(ErrorKind::kUsage, path + ": block size must be a power of two between 4096 and 1048576 elements");
  if (opt.level < -1 || opt.level > 3) fail(ErrorKind::kUsage, path + ": level must be -1, 0, 1, 2 or 3");
  if (opt.direct_io && (opt.direct_buffer_bytes < kDirectAlign || opt.direct_buffer_bytes % kDirectAlign ||
                        opt.direct_buffers < 2))
    fail(ErrorKind::kUsage, path + ": direct_buffer_bytes must be a multiple of 4096 and direct_buffers >= 2");
  if (path.empty()) fail(ErrorKind::kUsage, "empty output path");
  // The output rules of every writer (tzc_output.hpp); the frames are
  // written with pwrite at their offsets, so the output is a regular file.
  if (check_file_target(path, opt.force) == FileTarget::kStream)
    fail(ErrorKind::kUsage, path + ": not a regular file (a .tzip is written to a regular file)");
  remove_stale_temporaries(path);
  m.tmp = Temporary::create_file(path, &m.fd);
}

TensorWriter::~TensorWriter() {
  if (impl_) impl_->remove_tmp();
}

void TensorWriter::abort() {
  if (impl_->state == Impl::kOpen) impl_->state = Impl::kAborted;
  impl_->remove_tmp();
}

const std::string& TensorWriter::path() const { return impl_->path; }
uint64_t TensorWriter::chunk_bytes() const { return impl_->opt.chunk_bytes; }
const std::vector<TensorEntry>& TensorWriter::tensors() const { return impl_->out; }

Item& TensorWriter::Impl::add_common(const std::string& name, const std::string& dtype,
                                     const std::vector<uint64_t>& shape, uint64_t size, int level,
                                     unsigned block_elems) {
  if (state != kOpen) fail(ErrorKind::kUsage, path + ": tensor '" + name + "' added after finish() or abort()");
  if (name.empty()) fail(ErrorKind::kUsage, path + ": tensor with an empty name");
  if (name == "__metadata__") fail(ErrorKind::kUsage, path + ": '__metadata__' is not a tensor name");
  if (by_name.count(name)) fail(ErrorKind::kUsage, path + ": duplicate tensor name '" + name + "'");
  Item it;
  it.e.name = name;
  it.e.dtype = dtype;
  it.e.shape = shape;
  if (!codec_dtype_for(dtype, &it.e.codec_dtype))
    fail(ErrorKind::kUsage, path + ": tensor '" + name + "': unknown dtype '" + dtype + "'");
  uint64_t nbytes = 0;
  try {
    nbytes = tensor_nbytes(dtype, shape, path, name);
  } catch (const Error& e) {
    fail(ErrorKind::kUsage, e.what());
  }
  if (nbytes != size)
    fail(ErrorKind::kUsage, path + ": tensor '" + name + "': size " + std::to_string(size) +
                                " bytes does not match its dtype and shape (" + std::to_string(nbytes) + " bytes)");
  if (level < -1 || level > 3) fail(ErrorKind::kUsage, path + ": tensor '" + name + "': bad level");
  it.e.level = level;
  it.e.block_elems = block_elems ? block_elems : opt.block_elems ? opt.block_elems : default_block_elems(it.e.codec_dtype);
  if (it.e.block_elems < 4096 || it.e.block_elems > (1u << 20) || (it.e.block_elems & (it.e.block_elems - 1)))
    fail(ErrorKind::kUsage, path + ": tensor '" + name + "': bad block size");
  if (it.e.block_bytes() > opt.chunk_bytes)
    fail(ErrorKind::kUsage, path + ": tensor '" + name + "': a block (" + std::to_string(it.e.block_bytes()) +
                                " bytes) is larger than a chunk");
  it.e.data_begin = data_size;
  it.e.data_end = data_size + size;
  data_size += size;
  by_name[name] = items.size();
  items.push_back(std::move(it));
  return items.back();
}

void TensorWriter::add(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
                       const void* data, uint64_t size) {
  if (size && !data) fail(ErrorKind::kUsage, impl_->path + ": tensor '" + name + "': null data");
  Item& it = impl_->add_common(name, dtype, shape, size, impl_->opt.level, 0);
  it.src = Src::kHost;
  it.data = static_cast<const uint8_t*>(data);
}

void TensorWriter::add_frames(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
                              uint64_t size, std::vector<EncodedFrame> frames, int level, unsigned block_elems) {
  const uint64_t chunk = impl_->opt.chunk_bytes;
  const uint64_t want = (size + chunk - 1) / chunk;
  if (frames.size() != want)
    fail(ErrorKind::kUsage, impl_->path + ": tensor '" + name + "': " + std::to_string(frames.size()) +
                                " frames given, " + std::to_string(want) + " expected (one per chunk)");
  for (const auto& f : frames)
    if (!f.data || f.size < 32) fail(ErrorKind::kUsage, impl_->path + ": tensor '" + name + "': empty frame");
  Item& it = impl_->add_common(name, dtype, shape, size, level, block_elems);
  it.src = Src::kFrames;
  it.frames = std::move(frames);
}

void TensorWriter::add_encoder(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
                               uint64_t size, EncodeFn encode, int level, unsigned block_elems) {
  if (!encode) fail(ErrorKind::kUsage, impl_->path + ": tensor '" + name + "': no encoder");
  Item& it = impl_->add_common(name, dtype, shape, size, level, block_elems);
  it.src = Src::kEncoder;
  it.enc = std::move(encode);
}

TensorWriterStats TensorWriter::finish() {
  auto& m = *impl_;
  if (m.state != Impl::kOpen) fail(ErrorKind::kUsage, m.path + ": finish() called twice or after abort()");
  try {
    TensorWriterStats st = m.finish();
    m.state = Impl::kFinished;
    return st;
  } catch (...) {
    m.state = Impl::kAborted;
    m.remove_tmp();
    throw;
  }
}

TensorWriterStats TensorWriter::Impl::finish() {
  const auto t_start = Clock::now();
  TensorWriterStats stats;
  const uint64_t chunk = opt.chunk_bytes;

  // ---- header skeleton ----------------------------------------------------
  TzipHeader h;
  h.created_by = !opt.created_by.empty() ? opt.created_by
                                          : std::string("tensorzip ") + std::to_string(TZ_VERSION_MAJOR) + "." +
                                                std::to_string(TZ_VERSION_MINOR) + "." +
                                                std::to_string(TZ_VERSION_PATCH);
  h.chunk_bytes = chunk;
  h.data_size = data_size;
  h.metadata = opt.metadata;
  h.user_metadata = opt.user_metadata;
  if (!opt.safetensors_header.empty()) {
    check_given_header(opt.safetensors_header, items, opt.metadata, data_size, path);
    h.safetensors_header = opt.safetensors_header;
  } else {
    nlohmann::json sj = nlohmann::json::object();
    if (!opt.metadata.empty()) sj["__metadata__"] = opt.metadata;
    for (const auto& it : items)
      sj[it.e.name] = {{"dtype", it.e.dtype}, {"shape", it.e.shape}, {"data_offsets", {it.e.data_begin, it.e.data_end}}};
    h.safetensors_header = sj.dump();
  }

  // ---- cast prediction discovery ------------------------------------------
  if (opt.predict) {
    // FP32 host tensors by shape. Candidates of a target are tried with the
    // ones whose name ends with the target's name first (master.x for x),
    // and the search stops at the first candidate that matches the probe
    // exactly and passes the cost test: a save holding many FP32 tensors of
    // one shape (Adam m and v, other layers) stays linear in its size.
    std::map<std::vector<uint64_t>, std::vector<size_t>> by_shape;
    for (size_t j = 0; j < items.size(); ++j)
      if (items[j].src == Src::kHost && items[j].e.dtype == "F32" && items[j].e.raw_size() > 0)
        by_shape[items[j].e.shape].push_back(j);
    auto ends_with = [](const std::string& a, const std::string& b) {
      return a.size() > b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0;
    };
    CastScratch scratch;
    for (size_t i = 0; i < items.size() && !by_shape.empty(); ++i) {
      Item& t = items[i];
      if (t.src != Src::kHost || t.e.raw_size() == 0) continue;
      const int kind = cast_kind(t.e.dtype);
      if (kind < 0) continue;
      const auto shp = by_shape.find(t.e.shape);
      if (shp == by_shape.end()) continue;
      std::vector<size_t> cands;
      for (size_t j : shp->second)
        if (ends_with(items[j].e.name, t.e.name)) cands.push_back(j);
      for (size_t j : shp->second)
        if (!ends_with(items[j].e.name, t.e.name)) cands.push_back(j);
      CastData cd;
      cd.read_target = [&](uint64_t first, uint64_t count, uint8_t* dst) {
        std::memcpy(dst, t.data + first * 2, count * 2);
      };
      cd.cand_probe = [&](size_t k, uint64_t first, uint64_t) -> const uint8_t* {
        return items[cands[k]].data + first * 4;
      };
      cd.read_cand = [&](size_t k, uint64_t first, uint64_t count, uint8_t* dst) {
        std::memcpy(dst, items[cands[k]].data + first * 4, count * 4);
      };
      const long w = find_cast_source(t.e.raw_size() / 2, kind, opt.min_gain, cands.size(), cd,
                                      /*stop_at_exact=*/true, &scratch);
      if (w >= 0) t.cast_from = (long)cands[(size_t)w];
      if (t.cast_from >= 0) {
        t.e.predict.kind = PredictKind::kCast;
        t.e.predict.ref = -1;
        t.e.predict.source = items[(size_t)t.cast_from].e.name;
        h.major = kTzipVersionMajorPredicted;
        ++stats.predicted;
      }
    }
  }
  // ---- delta prediction discovery (TensorWriterOptions::ref) ---------------
  std::unique_ptr<Reader> dref;
  std::unique_ptr<RefOriginal> dref_orig;  // TensorWriterOptions::ref_original
  if (!opt.ref_original.empty() && opt.ref.empty())
    fail(ErrorKind::kUsage, path + ": ref_original needs ref (the previous checkpoint's .tzip)");
  if (!opt.ref.empty()) {
    check_not_same_file(opt.ref, path);  // the new file would replace its own reference
    dref = std::make_unique<Reader>(opt.ref, 1);
    ReaderAccess::verify_frames_on_use(*dref);  // its header checksum is recorded
    if (!opt.ref_original.empty()) dref_orig = std::make_unique<RefOriginal>(opt.ref_original, *dref, opt.ref);
    int ref_index = -1;
    std::vector<uint8_t> cur, blk;
    for (size_t i = 0; i < items.size(); ++i) {
      Item& t = items[i];
      if (t.src != Src::kHost || t.cast_from >= 0 || t.e.raw_size() == 0) continue;
      const unsigned bits = dtype_bits(t.e.dtype);
      if (bits == 0 || bits % 8 != 0) continue;  // sub-byte dtypes: never predicted
      const unsigned esz = bits / 8;
      const long ri = dref->find(t.e.name);
      if (ri < 0) continue;
      const TensorEntry& rt = dref->tensors()[(size_t)ri];
      if (rt.dtype != t.e.dtype || rt.shape != t.e.shape) continue;
      const DeltaWindow dw = delta_window(rt, esz);
      blk.resize(dw.blk_len);
      dref->read_range((size_t)ri, dw.blk_off, dw.blk_len, blk.data());  // exactly one block
      cur.assign(t.data + dw.first * esz, t.data + (dw.first + dw.elems) * esz);
      if (!delta_pays(cur.data(), blk.data(), dw.elems, esz, opt.min_gain)) continue;
      if (ref_index < 0) {
        ref_index = (int)h.references.size();
        h.references.push_back(Reference{relative_path(opt.ref, path), dref->file_checksum(), true,
                                         dref->header_checksum()});
      }
      t.delta_of = ri;
      t.e.predict.kind = PredictKind::kDelta;
      t.e.predict.ref = ref_index;
      t.e.predict.source.clear();
      h.major = kTzipVersionMajorPredicted;
      ++stats.deltas;
    }
  }
  for (const auto& it : items) h.tensors.push_back(it.e);
  link_segments(&h);

  std::vector<Unit> units;
  for (size_t i = 0; i < items.size(); ++i)
    for (uint64_t off = 0, k = 0; off < items[i].e.raw_size(); off += chunk, ++k)
      units.push_back({i, off, std::min(chunk, items[i].e.raw_size() - off), k});

  // ---- back end: O_DIRECT where asked and allowed ---------------------------
  int dfd = -1;
  struct CloseFd {
    int& fd;
    ~CloseFd() {
      if (fd >= 0) ::close(fd);
    }
  } close_dfd{dfd};
  // TZ_TEST_REFUSE_O_DIRECT=1 makes this process behave as on a file system
  // that refuses O_DIRECT (tests of the fallback on machines where every
  // file system accepts it).
  const char* refuse = std::getenv("TZ_TEST_REFUSE_O_DIRECT");
  if (opt.direct_io && !(refuse && *refuse == '1')) {
    dfd = ::open(tmp.path().c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
    if (dfd >= 0) {
      // Probe: one aligned block at offset 0 (overwritten by the preamble's
      // block). tmpfs and some others refuse O_DIRECT at open or here.
      void* probe = nullptr;
      if (::posix_memalign(&probe, kDirectAlign, kDirectAlign) != 0) fail(ErrorKind::kInternal, path + ": out of memory");
      std::memset(probe, 0, kDirectAlign);
      const int e = tz::io::pwrite_full(dfd, probe, kDirectAlign, 0);
      std::free(probe);
      if (e == EINVAL) ::close(dfd), dfd = -1;
      else if (e) fail_io(path, "write failed", e);
    }
  }
  const bool direct = dfd >= 0;
  std::unique_ptr<Sink> sink = opt.sink ? opt.sink(direct ? dfd : fd, direct) : make_pwrite_sink(direct ? dfd : fd, direct);
  if (!sink) fail(ErrorKind::kInternal, path + ": the sink factory returned no sink");
  stats.direct = direct;
  stats.io = sink->name() + (direct ? "+O_DIRECT" : "");

  uint8_t pre[kAlign] = {};
  std::memcpy(pre, kMagic, 4);
  put_le32(pre + 8, kFlagHeaderZstd);
  put_le16(pre + 4, h.major);
  put_le16(pre + 6, kTzipVersionMinor);
  XXH64_state_t* fh = XXH64_createState();
  if (!fh) fail(ErrorKind::kInternal, path + ": out of memory");
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> fh_guard(fh, &XXH64_freeState);
  XXH64_reset(fh, 0);
  const FramesWritten fw = write_frames(path, pre, items, units, dref.get(), dref_orig.get(), opt, *sink, direct, fh,
                                          h.tensors);
  const uint64_t pos = fw.end;

  // ---- header + trailer ------------------------------------------------------
  const uint64_t header_offset = pos;
  const std::string json = encode_header(h);
  if (json.size() > kMaxHeaderBytes) fail(ErrorKind::kUsage, path + ": tensor table too large for a .tzip header");
  std::string tail = pack_header(json);
  const uint64_t header_size = tail.size();
  uint8_t tr[kTrailerSize] = {};
  put_le64(tr + 0, header_offset);
  put_le64(tr + 8, header_size);
  put_le64(tr + 16, XXH64(tail.data(), tail.size(), 0));
  put_le16(tr + 24, h.major);
  put_le16(tr + 26, kTzipVersionMinor);
  XXH64_update(fh, tail.data(), tail.size());
  XXH64_update(fh, tr, kTrailerHashedSize);
  stats.file_xxh64 = XXH64_digest(fh);
  put_le64(tr + 32, stats.file_xxh64);
  std::memcpy(tr + 44, kEndMagic, 4);
  tail.append(reinterpret_cast<const char*>(tr), kTrailerSize);
  // Buffered, after every direct write completed (the page cache then reads
  // the last partial block from the file).
  if (const int e = tz::io::pwrite_full(fd, tail.data(), tail.size(), header_offset)) fail_io(path, "write failed", e);
  const uint64_t file_bytes = header_offset + tail.size();
  if (direct && ::ftruncate(fd, (off_t)file_bytes) != 0) fail_io(path, "truncate failed", errno);
  apply_attrs(fd, attrs_of(""), path);  // 0666 & ~umask, as a newly created file
  if (::fsync(fd) != 0) fail_io(path, "fsync failed", errno);
  sink.reset();
  if (dfd >= 0) ::close(dfd), dfd = -1;
  const int cfd = fd;
  fd = -1;
  if (::close(cfd) != 0) fail_io(path, "close failed", errno);
  publish(tmp.path(), path, opt.force, false);  // rename + fsync of the folder
  tmp.release();

  out = h.tensors;
  stats.raw_bytes = data_size;
  stats.file_bytes = file_bytes;
  stats.encode_seconds = (double)fw.encode_ns * 1e-9;
  stats.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return stats;
}

}  // namespace tz::container

// TensorWriter: a .tzip file from named tensors (container.hpp), the one
// writer of the library: compress_file hands it a safetensors file's
// segments (writer/compress_file.cpp).
//
// Tensors are cut into chunk_bytes chunks, coded and written in order by
// write_frames (writer/write_frames.cpp: `threads` threads in all, memory
// bounded by `slots` chunks); this file builds the tensor table, has the
// predicted tensors found (writer/discovery.cpp), opens the output
// (O_DIRECT where asked and allowed) and writes the header and trailer.
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
#include "internal.hpp"
#include "file_io.hpp"
#include "prediction.hpp"
#include "writer/write_frames.hpp"
#include "writer/writer_impl.hpp"
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
  Temporary tmp;  // the file being written, beside `path` (not with `input`)
  int fd = -1;
  TensorWriterOptions opt;
  std::unique_ptr<FileInput> input;  // compress_file: its safetensors input; output through OutFile
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
  TzipHeader header_skeleton();
  void refuse_oversized_header(TzipHeader& h, std::vector<TensorEntry>& segs, const std::vector<Unit>& units);
  std::string header_and_trailer(TzipHeader& h, uint64_t header_offset, XXH64_state_t* fh, TensorWriterStats& stats);
  uint64_t write_to_temporary(TzipHeader& h, std::vector<TensorEntry>& segs, const std::vector<Unit>& units,
                              const Predictions& pred, TensorWriterStats& stats);
  uint64_t write_through(TzipHeader& h, std::vector<TensorEntry>& segs, const std::vector<Unit>& units,
                         const Predictions& pred, TensorWriterStats& stats);
};

TensorWriter::TensorWriter(const std::string& path, const TensorWriterOptions& opt) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.path = path;
  m.opt = opt;
  check_write_options(opt.level, opt.block_elems, opt.chunk_bytes, path);
  if (opt.direct_io && (opt.direct_buffer_bytes < kDirectAlign || opt.direct_buffer_bytes % kDirectAlign ||
                        opt.direct_buffers < 2))
    fail(ErrorKind::kUsage, path + ": direct_buffer_bytes must be a multiple of 4096 and direct_buffers >= 2");
  if (path.empty()) fail(ErrorKind::kUsage, "empty output path");
  // The output rules of every writer (output.hpp); the frames are
  // written with pwrite at their offsets, so the output is a regular file.
  if (check_file_target(path, opt.force) == FileTarget::kStream)
    fail(ErrorKind::kUsage, path + ": not a regular file (a .tzip is written to a regular file)");
  remove_stale_temporaries(path);
  m.tmp = Temporary::create_file(path, &m.fd);
}

TensorWriter::TensorWriter() = default;

std::unique_ptr<TensorWriter> WriterAccess::for_file(const std::string& path, const TensorWriterOptions& opt,
                                                     FileInput input) {
  check_write_options(opt.level, opt.block_elems, opt.chunk_bytes);
  std::unique_ptr<TensorWriter> w(new TensorWriter());
  w->impl_ = std::make_unique<TensorWriter::Impl>();
  auto& m = *w->impl_;
  m.path = path;
  m.opt = opt;
  m.input = std::make_unique<FileInput>(std::move(input));
  const SafetensorsInfo& st = m.input->st;
  m.data_size = st.data_size;
  for (const auto* list : {&st.tensors, &st.gaps})
    for (const TensorEntry& t : *list) {
      Item it;
      it.e = t;
      if (t.is_gap) it.e.codec_dtype = TZ_DTYPE_BYTES;
      it.e.level = opt.level;
      it.e.block_elems = opt.block_elems ? opt.block_elems : default_block_elems(it.e.codec_dtype);
      it.bytes = ByteSource{nullptr, m.input->file.get(), st.data_start + t.data_begin};
      m.items.push_back(std::move(it));
    }
  // Segments tile the data section: file order is data order.
  std::stable_sort(m.items.begin(), m.items.end(), [](const Item& a, const Item& b) {
    return a.e.data_begin != b.e.data_begin ? a.e.data_begin < b.e.data_begin : a.e.data_end < b.e.data_end;
  });
  return w;
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
  if (input) fail(ErrorKind::kUsage, path + ": tensor '" + name + "' added to a writer of a safetensors file");
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
  check_level(level, path + ": tensor '" + name + "'");
  check_block_elems(block_elems, path + ": tensor '" + name + "'");
  it.e.level = level;
  it.e.block_elems = block_elems ? block_elems : opt.block_elems ? opt.block_elems : default_block_elems(it.e.codec_dtype);
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
  it.bytes.data = static_cast<const uint8_t*>(data);
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

namespace {
// The header's segments: the items' entries as stored (segs[i] of item i),
// tensors and gaps apart.
void set_segments(TzipHeader* h, const std::vector<TensorEntry>& segs) {
  h->tensors.clear();
  h->gaps.clear();
  for (const auto& e : segs) (e.is_gap ? h->gaps : h->tensors).push_back(e);
  link_segments(h);
}
}  // namespace

TzipHeader TensorWriter::Impl::header_skeleton() {
  TzipHeader h;
  h.created_by = !opt.created_by.empty() ? opt.created_by
                                          : std::string("tensorzip ") + std::to_string(TZ_VERSION_MAJOR) + "." +
                                                std::to_string(TZ_VERSION_MINOR) + "." +
                                                std::to_string(TZ_VERSION_PATCH);
  h.chunk_bytes = opt.chunk_bytes;
  h.data_size = data_size;
  h.metadata = opt.metadata;
  h.user_metadata = opt.user_metadata;
  if (input) {  // its own header, verbatim
    h.metadata = input->st.metadata;
    h.safetensors_header = input->st.header_bytes;
  } else if (!opt.safetensors_header.empty()) {
    check_given_header(opt.safetensors_header, items, opt.metadata, data_size, path);
    h.safetensors_header = opt.safetensors_header;
  } else {
    nlohmann::json sj = nlohmann::json::object();
    if (!opt.metadata.empty()) sj["__metadata__"] = opt.metadata;
    for (const auto& it : items)
      sj[it.e.name] = {{"dtype", it.e.dtype}, {"shape", it.e.shape}, {"data_offsets", {it.e.data_begin, it.e.data_end}}};
    h.safetensors_header = sj.dump();
  }
  return h;
}

namespace {
[[noreturn]] void fail_header_too_large(const std::string& who, bool input, size_t bytes) {
  fail(input ? ErrorKind::kBadInput : ErrorKind::kUsage,
       who + ": tensor table too large for a .tzip header (" + std::to_string(bytes) +
           " bytes of JSON; the limit is " + std::to_string(kMaxHeaderBytes) + ")");
}
}  // namespace

// The header with every frame present but each number at its shortest is a
// lower bound of the header written: a table that cannot fit is refused
// before any data is read or written.
void TensorWriter::Impl::refuse_oversized_header(TzipHeader& h, std::vector<TensorEntry>& segs,
                                                 const std::vector<Unit>& units) {
  for (const Unit& u : units) segs[u.item].frames.push_back(FrameRef{});
  set_segments(&h, segs);
  const size_t least = encode_header(h).size();
  for (auto& s : segs) s.frames.clear();
  if (least > kMaxHeaderBytes) fail_header_too_large(input ? input->path : path, input != nullptr, least);
}

// The packed header and the trailer (their bytes hashed into fh, which then
// gives the file checksum).
std::string TensorWriter::Impl::header_and_trailer(TzipHeader& h, uint64_t header_offset, XXH64_state_t* fh,
                                                   TensorWriterStats& stats) {
  const std::string json = encode_header(h);
  if (json.size() > kMaxHeaderBytes) fail_header_too_large(input ? input->path : path, input != nullptr, json.size());
  std::string tail = pack_header(json);
  uint8_t tr[kTrailerSize] = {};
  put_le64(tr + 0, header_offset);
  put_le64(tr + 8, tail.size());
  put_le64(tr + 16, XXH64(tail.data(), tail.size(), 0));
  put_le16(tr + 24, h.major);
  put_le16(tr + 26, kTzipVersionMinor);
  XXH64_update(fh, tail.data(), tail.size());
  XXH64_update(fh, tr, kTrailerHashedSize);
  stats.file_xxh64 = XXH64_digest(fh);
  put_le64(tr + 32, stats.file_xxh64);
  std::memcpy(tr + 44, kEndMagic, 4);
  tail.append(reinterpret_cast<const char*>(tr), kTrailerSize);
  return tail;
}

namespace {
// The preamble (section 2.1), zero-padded to the first frame's offset.
void preamble(const TzipHeader& h, uint8_t (&pre)[kAlign]) {
  std::memset(pre, 0, kAlign);
  std::memcpy(pre, kMagic, 4);
  put_le32(pre + 8, kFlagHeaderZstd);
  put_le16(pre + 4, h.major);
  put_le16(pre + 6, kTzipVersionMinor);
}

using XxhPtr = std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)>;
XxhPtr new_file_hash(const std::string& path) {
  XXH64_state_t* fh = XXH64_createState();
  if (!fh) fail(ErrorKind::kInternal, path + ": out of memory");
  XXH64_reset(fh, 0);
  return XxhPtr(fh, &XXH64_freeState);
}

// An OutFile as a sink: writes arrive in file order and are buffered by it.
class OutFileSink final : public Sink {
 public:
  explicit OutFileSink(OutFile& out) : out_(out) {}
  void write(uint64_t off, const void* p, size_t n, std::function<void()> done) override {
    if (off != out_.offset()) fail(ErrorKind::kInternal, out_.path() + ": frames out of order");
    out_.write(p, n);  // a throw owes no `done` (the pipeline's commit rule)
    if (done) done();
  }
  int drain() override { return 0; }
  std::string name() const override { return "write"; }

 private:
  OutFile& out_;
};
}  // namespace

// compress_file's output: OutFile (a temporary published on commit, or a
// stream written through), with the input's permission bits and times.
uint64_t TensorWriter::Impl::write_through(TzipHeader& h, std::vector<TensorEntry>& segs,
                                          const std::vector<Unit>& units, const Predictions& pred,
                                          TensorWriterStats& stats) {
  OutFile o(path, opt.force, input->path, input->output_fd);
  OutFileSink sink(o);
  stats.io = sink.name();
  uint8_t pre[kAlign];
  preamble(h, pre);
  XxhPtr fh = new_file_hash(path);
  const FramesWritten fw = write_frames(path, pre, items, units, pred.dref.get(), pred.dref_orig.get(), opt, sink,
                                        false, fh.get(), segs, /*huge_pages=*/true);
  stats.encode_seconds = (double)fw.encode_ns * 1e-9;
  set_segments(&h, segs);
  const std::string tail = header_and_trailer(h, fw.end, fh.get(), stats);
  o.write(tail.data(), tail.size());
  const uint64_t file_bytes = o.offset();
  o.commit();
  return file_bytes;
}

// TensorWriter's output: the temporary created by the constructor, written
// at offsets (O_DIRECT where asked and allowed), fsync'd and renamed.
uint64_t TensorWriter::Impl::write_to_temporary(TzipHeader& h, std::vector<TensorEntry>& segs,
                                                const std::vector<Unit>& units, const Predictions& pred,
                                                TensorWriterStats& stats) {
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

  uint8_t pre[kAlign];
  preamble(h, pre);
  XxhPtr fh = new_file_hash(path);
  const FramesWritten fw = write_frames(path, pre, items, units, pred.dref.get(), pred.dref_orig.get(), opt, *sink,
                                        direct, fh.get(), segs);
  stats.encode_seconds = (double)fw.encode_ns * 1e-9;
  set_segments(&h, segs);
  const uint64_t header_offset = fw.end;
  const std::string tail = header_and_trailer(h, header_offset, fh.get(), stats);
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
  return file_bytes;
}

TensorWriterStats TensorWriter::Impl::finish() {
  const auto t_start = Clock::now();
  TensorWriterStats stats;
  TzipHeader h = header_skeleton();
  PredictionRules rules;
  rules.predict = opt.predict;
  rules.min_gain = opt.min_gain;
  rules.ref = opt.ref;
  rules.ref_original = opt.ref_original;
  rules.name_first = !input;
  Predictions pred;
  find_predictions(items, input ? input->others : std::vector<CastSourceFile>{}, rules, path, &h, &pred);
  stats.predicted = pred.casts;
  stats.deltas = pred.deltas;

  const uint64_t chunk = opt.chunk_bytes;
  std::vector<TensorEntry> segs;  // the items' entries as stored
  std::vector<Unit> units;
  for (size_t i = 0; i < items.size(); ++i) {
    segs.push_back(items[i].e);
    for (uint64_t off = 0, k = 0; off < items[i].e.raw_size(); off += chunk, ++k)
      units.push_back({i, off, std::min(chunk, items[i].e.raw_size() - off), k});
  }
  refuse_oversized_header(h, segs, units);
  const uint64_t file_bytes = input ? write_through(h, segs, units, pred, stats)
                                    : write_to_temporary(h, segs, units, pred, stats);
  out = h.tensors;
  stats.raw_bytes = data_size;
  stats.file_bytes = file_bytes;
  stats.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return stats;
}

}  // namespace tz::container

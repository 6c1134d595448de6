// TensorWriter: a .tzip file from named tensors in memory (container.hpp).
//
// Tensors are cut into chunk_bytes chunks; `threads` workers encode chunks
// (one single-threaded tz_ctx each) into a ring of `slots` reusable buffers,
// or take the caller's pre-encoded frames; the calling thread, in file order,
// assigns offsets, hashes and hands each frame to the Sink (the I/O back
// end), and a slot is reused once its write completed. So encode of chunk
// k+1.. overlaps the write of chunk k and memory is slots x
// tz_compress_bound(chunk_bytes) whatever the file size. With O_DIRECT the
// frames are gathered into aligned staging buffers first.
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
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "codec/predict.h"
#include "tzc_internal.hpp"
#include "tzc_io.hpp"
#include "tzc_predict.hpp"
#include "write_queue.hpp"

namespace tz::container {

using namespace detail;

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kDirectAlign = 4096;

class PwriteSink final : public Sink {
 public:
  explicit PwriteSink(int fd) : fd_(fd) {}
  void write(uint64_t off, const void* p, size_t n, std::function<void()> done) override {
    if (!err_) err_ = tz::io::pwrite_full(fd_, p, n, off);
    if (done) done();
  }
  int drain() override { return err_; }
  int error() const override { return err_; }
  std::string name() const override { return "pwrite"; }

 private:
  int fd_;
  int err_ = 0;
};

[[noreturn]] void fail_io(const std::string& path, const std::string& what, int err) {
  throw Error(err == ENOMEM ? ErrorKind::kInternal : ErrorKind::kIO, path + ": " + what + ": " + std::strerror(err),
              err);
}

// Discovery follows compress_file (tzip_writer.cpp) with the shared rules
// of tzc_predict.hpp, on memory. Cast: find_cast_source (a 64-element probe,
// then the residual's cost on a sample against min_gain), stopping at the
// first candidate exact on the probe. Delta (TensorWriterOptions::ref): the tensor of the same
// name, dtype and shape in the reference, sampled on one decoded block.

enum class Src { kHost, kFrames, kEncoder };

struct Item {
  TensorEntry e;
  Src src = Src::kHost;
  const uint8_t* data = nullptr;
  std::vector<EncodedFrame> frames;
  TensorWriter::EncodeFn enc;
  long cast_from = -1;  // item index of the FP32 source (kHost only)
  long delta_of = -1;   // tensor index in the reference (kHost only)
};

struct Unit {
  size_t item;
  uint64_t off, n, k;  // raw offset in the tensor, raw bytes, chunk index
};

struct Slot {
  Buf comp;
  size_t frame_size = 0;
  uint64_t hash = 0;
  size_t allowed = 0;  // the unit that may use this slot next
  bool encoded = false;
};

struct AlignedBuf {
  uint8_t* p = nullptr;
  bool busy = false;
  AlignedBuf() = default;
  AlignedBuf(AlignedBuf&& o) noexcept : p(o.p), busy(o.busy) { o.p = nullptr; }
  AlignedBuf(const AlignedBuf&) = delete;
  ~AlignedBuf() { std::free(p); }
};

}  // namespace

std::unique_ptr<Sink> make_pwrite_sink(int fd) { return std::make_unique<PwriteSink>(fd); }

struct TensorWriter::Impl {
  std::string path, tmp;
  int slot = -1;
  int fd = -1;
  TensorWriterOptions opt;
  std::vector<Item> items;
  std::map<std::string, size_t> by_name;
  uint64_t data_size = 0;
  std::vector<TensorEntry> out;
  enum { kOpen, kFinished, kAborted } state = kOpen;

  void remove_tmp() {
    if (fd >= 0) ::close(fd), fd = -1;
    if (!tmp.empty()) {
      ::unlink(tmp.c_str());
      unregister_temp(slot);
      tmp.clear();
    }
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
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail(ErrorKind::kUsage, path + ": is a directory, expected a file name");
    if (!opt.force) fail(ErrorKind::kExists, path + ": already exists (use -f to overwrite)");
  }
  m.tmp = make_temp_name(path);
  m.slot = register_temp(m.tmp);
  m.fd = ::open(m.tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (m.fd < 0) {
    const int err = errno;
    unregister_temp(m.slot);
    m.tmp.clear();
    fail_io(path, "cannot create output in " + dir_of(path), err);
  }
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
  {
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
  if (!opt.ref.empty()) {
    check_not_same_file(opt.ref, path);  // the new file would replace its own reference
    dref = std::make_unique<Reader>(opt.ref, 1);
    ReaderAccess::verify_frames_on_use(*dref);  // its header checksum is recorded
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
    dfd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
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
  std::unique_ptr<Sink> sink = opt.sink ? opt.sink(direct ? dfd : fd, direct) : make_pwrite_sink(direct ? dfd : fd);
  if (!sink) fail(ErrorKind::kInternal, path + ": the sink factory returned no sink");
  stats.direct = direct;
  stats.io = sink->name() + (direct ? "+O_DIRECT" : "");

  const unsigned workers = std::max<unsigned>(1, std::min<size_t>(resolve_threads(opt.threads), std::max<size_t>(1, units.size())));
  const size_t n_slots = std::max<size_t>(2, opt.slots ? opt.slots : workers + 4);
  std::vector<Slot> slots(n_slots);
  for (size_t i = 0; i < n_slots; ++i) slots[i].allowed = i;
  const size_t cap = tz_compress_bound(chunk) + kAlign;
  CtxSet ctx(workers);

  std::mutex mu;
  std::condition_variable cv;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> encode_ns{0};
  bool stop = false;
  std::exception_ptr error;
  auto set_error = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(mu);
    if (!error) error = e;
    stop = true;
    cv.notify_all();
  };

  auto label = [&](const Unit& u) {
    return path + ": tensor '" + items[u.item].e.name + "', chunk " + std::to_string(u.k);
  };
  // Checks a frame from outside the writer's own encoder.
  auto check_frame = [&](const Unit& u, const uint8_t* p, size_t size) {
    tz_frame_info fi{};
    const size_t r = tz_frame_inspect(p, size, &fi);
    if (tz_is_error(r)) fail(ErrorKind::kUsage, label(u) + ": not a valid frame: " + tz_get_error_name(r));
    const TensorEntry& e = items[u.item].e;
    if (fi.frame_size != size) fail(ErrorKind::kUsage, label(u) + ": frame size disagrees with its header");
    if (fi.raw_size != u.n)
      fail(ErrorKind::kUsage, label(u) + ": frame holds " + std::to_string(fi.raw_size) + " raw bytes, the chunk " +
                                  std::to_string(u.n));
    if (fi.dtype != e.codec_dtype) fail(ErrorKind::kUsage, label(u) + ": frame dtype differs from the tensor's");
    if (fi.dtype != TZ_DTYPE_BYTES && fi.block_elems != e.block_elems)
      fail(ErrorKind::kUsage, label(u) + ": frame block size differs from the tensor's");
  };

  // ---- in-order writer (this thread) -----------------------------------------
  XXH64_state_t* fh = XXH64_createState();
  if (!fh) fail(ErrorKind::kInternal, path + ": out of memory");
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> fh_guard(fh, &XXH64_freeState);
  XXH64_reset(fh, 0);
  uint8_t pre[kAlign] = {};
  std::memcpy(pre, kMagic, 4);
  put_le32(pre + 8, kFlagHeaderZstd);
  put_le16(pre + 4, h.major);
  put_le16(pre + 6, kTzipVersionMinor);
  XXH64_update(fh, pre, kAlign);

  // O_DIRECT staging: a ring of aligned buffers, each covering the next
  // direct_buffer_bytes of the file.
  std::vector<AlignedBuf> stage;
  size_t cur = 0;
  uint64_t fill = 0, base = 0;
  const uint64_t B = opt.direct_buffer_bytes;
  auto flush_stage = [&](uint64_t len) {
    AlignedBuf& b = stage[cur];
    std::memset(b.p + len, 0, ((len + kDirectAlign - 1) & ~(kDirectAlign - 1)) - len);
    len = (len + kDirectAlign - 1) & ~(kDirectAlign - 1);
    {
      std::lock_guard<std::mutex> lk(mu);
      b.busy = true;
    }
    sink->write(base, b.p, len, [&, i = cur] {
      std::lock_guard<std::mutex> lk(mu);
      stage[i].busy = false;
      cv.notify_all();
    });
    cur = (cur + 1) % stage.size();
    base += B;
    fill = 0;
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return !stage[cur].busy; });
  };
  auto stage_bytes = [&](const uint8_t* p, uint64_t n) {
    while (n) {
      const uint64_t k = std::min(n, B - fill);
      if (p) std::memcpy(stage[cur].p + fill, p, k);
      else std::memset(stage[cur].p + fill, 0, k);
      fill += k, n -= k;
      if (p) p += k;
      if (fill == B) flush_stage(B);
    }
  };
  if (direct) {
    stage.resize(opt.direct_buffers);
    for (auto& b : stage)
      if (::posix_memalign(reinterpret_cast<void**>(&b.p), kDirectAlign, B) != 0)
        fail(ErrorKind::kInternal, path + ": out of memory");
  }
  // Every queued write has completed before the buffers above go away, on
  // any path out of here.
  struct DrainGuard {
    Sink* s;
    ~DrainGuard() {
      if (s) s->drain();
    }
  } drain_guard{sink.get()};
  if (direct) {
    stage_bytes(pre, kAlign);
  } else {
    sink->write(0, pre, kAlign, nullptr);
  }

  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      std::vector<uint8_t> resid, pred;
      try {
        for (;;) {
          const size_t ui = next.fetch_add(1);
          if (ui >= units.size()) break;
          Slot& s = slots[ui % n_slots];
          {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return stop || s.allowed == ui; });
            if (stop) break;
          }
          const Unit& u = units[ui];
          const Item& it = items[u.item];
          uint8_t* dst = s.comp.reserve(cap);
          size_t r = 0;
          if (it.src == Src::kFrames) {
            const EncodedFrame& f = it.frames[u.k];
            check_frame(u, static_cast<const uint8_t*>(f.data), f.size);
            std::memcpy(dst, f.data, f.size);
            r = f.size;
          } else if (it.src == Src::kEncoder) {
            r = it.enc(u.k, dst, cap - kAlign);
            if (tz_is_error(r)) fail(ErrorKind::kInternal, label(u) + ": encoder failed: " + tz_get_error_name(r));
            if (r > cap - kAlign) fail(ErrorKind::kInternal, label(u) + ": encoder overflowed its buffer");
            check_frame(u, dst, r);
          } else {
            const uint8_t* src = it.data + u.off;
            bool zero = false;
            if (it.cast_from >= 0) {
              // Residual = value XOR cast(source), formed in a worker buffer.
              resid.assign(src, src + u.n);
              tz::predict::cast_xor(items[(size_t)it.cast_from].data + u.off * 2, resid.data(), u.n / 2,
                                    it.e.dtype == "F16" ? tz::predict::kCastF16 : tz::predict::kCastBF16);
              uint64_t acc = 0;
              size_t k = 0;
              for (; k + 8 <= u.n; k += 8) acc |= load_le64(resid.data() + k);
              for (; k < u.n; ++k) acc |= resid[k];
              zero = acc == 0;  // exact prediction: a frame of size 0 (section 12.2)
              src = resid.data();
            } else if (it.delta_of >= 0) {
              // Residual = value XOR the reference's bytes of this chunk.
              pred.resize(u.n);
              dref->read_range((size_t)it.delta_of, u.off, u.n, pred.data());
              resid.assign(src, src + u.n);
              tz::predict::xor_bytes(pred.data(), resid.data(), u.n);
              uint64_t acc = 0;
              size_t k = 0;
              for (; k + 8 <= u.n; k += 8) acc |= load_le64(resid.data() + k);
              for (; k < u.n; ++k) acc |= resid[k];
              zero = acc == 0;
              src = resid.data();
            }
            if (!zero) {
              tz_params p{};
              p.dtype = it.e.codec_dtype;
              p.level = it.e.level;
              p.block_elems = it.e.block_elems;
              p.threads = 1;
              const auto t0 = Clock::now();
              r = tz_ctx_compress(ctx.v[w], dst, cap - kAlign, src, u.n, &p);
              encode_ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
              if (tz_is_error(r))
                fail(ErrorKind::kInternal, label(u) + ": compression failed: " + tz_get_error_name(r) + " " +
                                               tz_last_error_detail());
            }
          }
          std::memset(dst + r, 0, align_up(r) - r);
          const uint64_t hash = XXH64(dst, r, 0);
          std::lock_guard<std::mutex> lk(mu);
          s.frame_size = r;
          s.hash = hash;
          s.encoded = true;
          cv.notify_all();
        }
      } catch (...) {
        set_error(std::current_exception());
      }
    });
  }

  uint64_t pos = kAlign, done_raw = 0;
  try {
    if (opt.progress) opt.progress(0, data_size);
    for (size_t ui = 0; ui < units.size(); ++ui) {
      Slot& s = slots[ui % n_slots];
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || (s.allowed == ui && s.encoded); });
        if (stop) break;
      }
      check_cancel();
      if (const int e = sink->error()) fail_io(path, "write failed", e);
      const size_t padded = align_up(s.frame_size);
      FrameRef f;
      f.offset = pos;
      f.size = s.frame_size;
      f.raw_size = units[ui].n;
      f.xxh64 = s.hash;
      h.tensors[units[ui].item].frames.push_back(f);
      XXH64_update(fh, s.comp.p.get(), padded);
      auto release = [&, ui] {
        std::lock_guard<std::mutex> lk(mu);
        Slot& sl = slots[ui % n_slots];
        sl.encoded = false;
        sl.allowed = ui + n_slots;
        cv.notify_all();
      };
      if (direct) {
        stage_bytes(s.comp.p.get(), padded);
        release();
      } else {
        sink->write(pos, s.comp.p.get(), padded, release);
      }
      pos += padded;
      done_raw += units[ui].n;
      if (opt.progress) opt.progress(done_raw, data_size);
    }
    if (direct && fill) flush_stage(fill);
  } catch (...) {
    set_error(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    if (error) stop = true;
    cv.notify_all();
  }
  for (auto& t : pool) t.join();
  const int werr = sink->drain();
  if (error) std::rethrow_exception(error);
  if (werr) fail_io(path, "write failed", werr);

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
  if (::fsync(fd) != 0) fail_io(path, "fsync failed", errno);
  drain_guard.s = nullptr;
  sink.reset();
  if (dfd >= 0) ::close(dfd), dfd = -1;
  const int cfd = fd;
  fd = -1;
  if (::close(cfd) != 0) fail_io(path, "close failed", errno);
  publish(tmp, path, opt.force, false);  // rename + fsync of the folder
  unregister_temp(slot);
  tmp.clear();

  out = h.tensors;
  stats.raw_bytes = data_size;
  stats.file_bytes = file_bytes;
  stats.encode_seconds = (double)encode_ns.load() * 1e-9;
  stats.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return stats;
}

}  // namespace tz::container

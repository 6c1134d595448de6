// TensorWriter's frames (writer/write_frames.hpp). Each chunk, or group of
// consecutive small chunks (group_items), is an item of the ordered
// pipeline (common/ordered_pipeline.h): work codes it (or checks a
// caller's pre-encoded frame) into the item's slot, on any of the writer's
// threads; commit, in file order, assigns its offset, hashes it and hands
// it to the Sink (the I/O back end); the slot is reused once that write
// completed. So coding of chunks k+1.. overlaps the write of chunk k, every
// thread count writes the same bytes, and memory is slots x the larger of
// tz_compress_bound(chunk_bytes) and a group's bound (the sum of its
// chunks' tz_compress_bound; pages of it that no frame fills are never
// touched) whatever the file size. With O_DIRECT the
// frames are gathered into aligned staging buffers first.
#include "writer/write_frames.hpp"

#include <errno.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "codec/predict.h"
#include "common/ordered_pipeline.h"
#include "internal.hpp"
#include "file_io.hpp"
#include "pipeline.hpp"
#include "prediction.hpp"

namespace tz::container::detail {

void fail_io(const std::string& path, const std::string& what, int err) {
  throw Error(err == ENOMEM ? ErrorKind::kInternal : ErrorKind::kIO, path + ": " + what + ": " + std::strerror(err),
              err);
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kDirectAlign = 4096;

// A group of consecutive units (group_items, pipeline.hpp): their
// frames lie in comp as they will in the file, each at a multiple of 64.
struct Slot {
  Buf comp;
  std::vector<size_t> at, frame_size;
  std::vector<uint64_t> hash;
  size_t bytes = 0;
};

// Per-thread buffers for residuals (and chunks read from files); never
// zero-filled, as their bytes are always written before they are read.
struct Scratch {
  Buf resid, pred;
  size_t at_least = 0;  // the largest chunk: each buffer is allocated once
};

// O_DIRECT staging: a ring of aligned buffers, each covering the next
// `bytes` of the file, written through the sink when full.
class DirectStage {
 public:
  DirectStage(const std::string& path, Sink& sink, uint64_t bytes, unsigned buffers)
      : path_(path), sink_(sink), b_(bytes), bufs_(buffers) {
    for (auto& b : bufs_)
      if (::posix_memalign(reinterpret_cast<void**>(&b.p), kDirectAlign, b_) != 0)
        fail(ErrorKind::kInternal, path_ + ": out of memory");
  }
  // Appends n bytes of p (zeros when p is null).
  void put(const uint8_t* p, uint64_t n) {
    while (n) {
      const uint64_t k = std::min(n, b_ - fill_);
      if (p) std::memcpy(bufs_[cur_].p + fill_, p, k);
      else std::memset(bufs_[cur_].p + fill_, 0, k);
      fill_ += k, n -= k;
      if (p) p += k;
      if (fill_ == b_) flush(b_);
    }
  }
  // Writes the partly filled last buffer (padded to the alignment).
  void finish() {
    if (fill_) flush(fill_);
  }

 private:
  struct AlignedBuf {
    uint8_t* p = nullptr;
    bool busy = false;
    AlignedBuf() = default;
    AlignedBuf(const AlignedBuf&) = delete;
    ~AlignedBuf() { std::free(p); }
  };
  void flush(uint64_t len) {
    AlignedBuf& b = bufs_[cur_];
    const uint64_t padded = (len + kDirectAlign - 1) & ~(kDirectAlign - 1);
    std::memset(b.p + len, 0, padded - len);
    {
      std::lock_guard<std::mutex> lk(mu_);
      b.busy = true;
    }
    sink_.write(base_, b.p, padded, [this, i = cur_] {
      std::lock_guard<std::mutex> lk(mu_);
      bufs_[i].busy = false;
      cv_.notify_all();
    });
    cur_ = (cur_ + 1) % bufs_.size();
    base_ += b_;
    fill_ = 0;
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !bufs_[cur_].busy; });
  }
  const std::string& path_;
  Sink& sink_;
  const uint64_t b_;
  std::vector<AlignedBuf> bufs_;
  size_t cur_ = 0;
  uint64_t fill_ = 0, base_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
};

std::string unit_label(const std::string& path, const std::vector<WriterItem>& items, const WriterUnit& u) {
  return path + ": tensor '" + items[u.item].e.name + "', chunk " + std::to_string(u.k);
}

// Checks a frame from outside the writer's own encoder.
void check_frame(const std::string& label, const TensorEntry& e, const WriterUnit& u, const uint8_t* p, size_t size) {
  tz_frame_info fi{};
  const size_t r = tz_frame_inspect(p, size, &fi);
  if (tz_is_error(r)) fail(ErrorKind::kUsage, label + ": not a valid frame: " + tz_get_error_name(r));
  if (fi.frame_size != size) fail(ErrorKind::kUsage, label + ": frame size disagrees with its header");
  if (fi.raw_size != u.n)
    fail(ErrorKind::kUsage, label + ": frame holds " + std::to_string(fi.raw_size) + " raw bytes, the chunk " +
                                std::to_string(u.n));
  if (fi.dtype != e.codec_dtype) fail(ErrorKind::kUsage, label + ": frame dtype differs from the tensor's");
  if (fi.dtype != TZ_DTYPE_BYTES && fi.block_elems != e.block_elems)
    fail(ErrorKind::kUsage, label + ": frame block size differs from the tensor's");
}

bool all_zero(const uint8_t* p, size_t n) {
  uint64_t acc = 0;
  size_t k = 0;
  for (; k + 8 <= n; k += 8) acc |= load_le64(p + k);
  for (; k < n; ++k) acc |= p[k];
  return acc == 0;
}

// The frame of unit u in dst (capacity cap); returns its size (0: an exact
// prediction, section 12.2).
size_t code_unit(const std::string& path, const std::vector<WriterItem>& items, const WriterUnit& u, Reader* dref,
                 const RefOriginal* dref_orig, uint8_t* dst, size_t cap, tz_ctx* cx, Scratch& sc,
                 std::atomic<uint64_t>& encode_ns) {
  const WriterItem& it = items[u.item];
  if (it.src == WriterSource::kFrames) {
    const EncodedFrame& f = it.frames[u.k];
    check_frame(unit_label(path, items, u), it.e, u, static_cast<const uint8_t*>(f.data), f.size);
    std::memcpy(dst, f.data, f.size);
    return f.size;
  }
  if (it.src == WriterSource::kEncoder) {
    const size_t r = it.enc(u.k, dst, cap);
    if (tz_is_error(r))
      fail(ErrorKind::kInternal, unit_label(path, items, u) + ": encoder failed: " + tz_get_error_name(r));
    if (r > cap) fail(ErrorKind::kInternal, unit_label(path, items, u) + ": encoder overflowed its buffer");
    check_frame(unit_label(path, items, u), it.e, u, dst, r);
    return r;
  }
  // The chunk's bytes: in place in memory, else read into the thread's
  // buffer (also where a residual is formed).
  const bool predicted = it.cast_src.readable() || it.delta_of >= 0;
  const uint8_t* src = it.bytes.data && !predicted ? it.bytes.data + u.off : nullptr;
  uint8_t* resid = nullptr;
  if (!src) {
    resid = sc.resid.reserve(u.n, sc.at_least);
    it.bytes.read(u.off, u.n, resid);
    src = resid;
  }
  if (it.cast_src.readable()) {
    // Residual = value XOR cast(source).
    tz::predict::cast_xor(it.cast_src.view(u.off * 2, u.n * 2, sc.pred), resid, u.n / 2,
                          it.e.dtype == "F16" ? tz::predict::kCastF16 : tz::predict::kCastBF16);
    if (all_zero(resid, u.n)) return 0;
  } else if (it.delta_of >= 0) {
    // Residual = value XOR the reference's bytes of this chunk (decoded,
    // or read from ref_original and checked against its block checksums).
    uint8_t* pred = sc.pred.reserve(u.n, sc.at_least);
    if (dref_orig)
      dref_orig->read_checked(*dref, (size_t)it.delta_of, u.off, u.n, pred);
    else
      dref->read_range((size_t)it.delta_of, u.off, u.n, pred);
    tz::predict::xor_bytes(pred, resid, u.n);
    if (all_zero(resid, u.n)) return 0;
  }
  tz_params p{};
  p.dtype = it.e.codec_dtype;
  p.level = it.e.level;
  p.block_elems = it.e.block_elems;
  p.threads = 1;
  const auto t0 = Clock::now();
  const size_t r = tz_ctx_compress(cx, dst, cap, src, u.n, &p);
  encode_ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  if (tz_is_error(r))
    fail(ErrorKind::kInternal, unit_label(path, items, u) + ": compression failed: " + tz_get_error_name(r) + " " +
                                   tz_last_error_detail());
  return r;
}

}  // namespace

FramesWritten write_frames(const std::string& path, const uint8_t* pre, const std::vector<WriterItem>& items,
                           const std::vector<WriterUnit>& units, Reader* dref, const RefOriginal* dref_orig,
                           const TensorWriterOptions& opt, Sink& sink, bool direct, XXH64_state_t* fh,
                           std::vector<TensorEntry>& tensors, bool huge_pages) {
  // Consecutive chunks the writer codes itself travel as one pipeline item
  // (group_items: up to kGroupBytes raw bytes, kGroupItems chunks), so a file
  // of many small tensors is not handed between threads frame by frame. A
  // chunk whose frame comes from the caller (frames, encoder) travels alone
  // with the chunk size's bound, as before.
  const uint64_t chunk = opt.chunk_bytes;
  auto codes_itself = [&](const WriterUnit& u) { return items[u.item].src == WriterSource::kHost; };
  auto unit_cap = [&](const WriterUnit& u) { return codes_itself(u) ? tz_compress_bound(u.n) : tz_compress_bound(chunk); };
  const std::vector<ItemGroup> groups = group_items(units.size(), [&](size_t i) {
    return codes_itself(units[i]) ? units[i].n : kGroupBytes;
  });
  // opt.threads in total, the calling thread included.
  const unsigned threads = std::max<unsigned>(
      1, (unsigned)std::min<size_t>(resolve_threads(opt.threads), std::max<size_t>(1, groups.size())));
  const size_t n_slots = std::max<size_t>(2, opt.slots ? opt.slots : threads + 4);
  // Each item's buffers come from a pool (most recently freed first) and go
  // back when its write completed: a run that has few items in flight keeps
  // reusing the same warm buffers instead of cycling through every slot's.
  ReusePool<Slot> pool(n_slots);
  std::vector<Slot*> slots(n_slots, nullptr);  // pipeline slot -> the buffers its item holds
  CtxSet ctx(threads);
  std::vector<Scratch> scratch(threads);
  size_t max_unit = 0;
  for (const auto& u : units) max_unit = std::max<size_t>(max_unit, u.n);
  for (Scratch& s : scratch) s.resid.huge_pages = huge_pages, s.at_least = max_unit;
  std::atomic<uint64_t> encode_ns{0};

  std::unique_ptr<DirectStage> stage;
  if (direct) stage = std::make_unique<DirectStage>(path, sink, opt.direct_buffer_bytes, opt.direct_buffers);
  // Every queued write has completed before the buffers above go away, on
  // any path out of here.
  struct DrainGuard {
    Sink& s;
    ~DrainGuard() { s.drain(); }
  } drain_guard{sink};

  XXH64_update(fh, pre, kAlign);
  if (direct)
    stage->put(pre, kAlign);
  else
    sink.write(0, pre, kAlign, nullptr);

  uint64_t pos = kAlign, done_raw = 0, total_raw = 0;
  for (const auto& u : units) total_raw += u.n;
  if (opt.progress) opt.progress(0, total_raw);

  tz::cpu::OrderedPipeline* pipe = nullptr;
  tz::cpu::OrderedPipeline::Stages st;
  auto group_cap = [&](const ItemGroup& g) {
    size_t cap = 0;
    for (size_t k = 0; k < g.count; ++k) cap += unit_cap(units[g.first + k]) + kAlign;
    return cap;
  };
  size_t max_cap = 0;  // every slot's buffer is allocated once, at the largest group's bound
  for (const ItemGroup& g : groups) max_cap = std::max(max_cap, group_cap(g));
  st.work = [&](size_t gi, size_t si, unsigned w) {
    if (!slots[si]) slots[si] = pool.take();
    Slot& s = *slots[si];
    s.comp.huge_pages = huge_pages;
    const ItemGroup& g = groups[gi];
    uint8_t* dst = s.comp.reserve(group_cap(g), max_cap);
    s.at.resize(g.count);
    s.frame_size.resize(g.count);
    s.hash.resize(g.count);
    size_t at = 0;
    for (size_t k = 0; k < g.count; ++k) {
      const WriterUnit& u = units[g.first + k];
      const size_t r = code_unit(path, items, u, dref, dref_orig, dst + at, unit_cap(u), ctx.v[w], scratch[w],
                                 encode_ns);
      std::memset(dst + at + r, 0, align_up(r) - r);
      s.at[k] = at;
      s.frame_size[k] = r;
      s.hash[k] = XXH64(dst + at, r, 0);
      at += align_up(r);
    }
    s.bytes = at;
  };
  // The slot's buffers go back to the pool once its write completed.
  auto release = [&pool, &slots, &pipe](size_t gi, size_t si) {
    Slot* b = slots[si];
    slots[si] = nullptr;
    pool.give(b);
    pipe->release(gi);
  };
  st.commit = [&](size_t gi, size_t si) {
    Slot& s = *slots[si];
    const ItemGroup& g = groups[gi];
    if (const int e = sink.error()) fail_io(path, "write failed", e);
    for (size_t k = 0; k < g.count; ++k) {
      const WriterUnit& u = units[g.first + k];
      FrameRef f;
      f.offset = pos + s.at[k];
      f.size = s.frame_size[k];
      f.raw_size = u.n;
      f.xxh64 = s.hash[k];
      tensors[u.item].frames.push_back(f);
      done_raw += u.n;
      if (opt.progress) opt.progress(done_raw, total_raw);
    }
    XXH64_update(fh, s.comp.p.get(), s.bytes);
    const uint64_t at = pos;
    pos += s.bytes;  // s is not read once handed to the sink (it may be reused as soon as written)
    if (direct) {
      stage->put(s.comp.p.get(), s.bytes);
      release(gi, si);
    } else {
      sink.write(at, s.comp.p.get(), s.bytes, [release, gi, si] { release(gi, si); });
    }
  };
  st.commit_releases_later = true;
  st.poll = check_cancel;
  tz::cpu::OrderedPipeline p(groups.size(), n_slots, std::move(st));
  pipe = &p;
  p.run(threads);
  if (direct) stage->finish();
  if (const int werr = sink.drain()) fail_io(path, "write failed", werr);
  return FramesWritten{pos, encode_ns.load()};
}

}  // namespace tz::container::detail

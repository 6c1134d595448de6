// GPU side of the checkpoint engine (checkpoint_gpu.hpp). Host code using
// the CUDA runtime API and the batched CUDA codec (tensorzip_cuda.h).
#include "checkpoint_gpu.hpp"

#include <cuda_runtime_api.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "../io/cufile.hpp"
#include "codec/frame_prefix.h"
#include "codec/policy.h"
#include "common/ordered_pipeline.h"
#include "../io/write_queue.hpp"
#include "tensorzip/container.hpp"
#include "tensorzip/tensorzip_cuda.h"

namespace tz::checkpoint::gpu {

namespace {

[[noreturn]] void cuda_fail(const std::string& what, cudaError_t e) {
  throw std::runtime_error(what + ": " + cudaGetErrorString(e));
}
void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda_fail(what, e);
}
uint64_t up256(uint64_t x) { return (x + 255) & ~uint64_t{255}; }

struct Pool {
  std::mutex mu;
  std::multimap<size_t, void*> free_;
  std::map<void*, size_t> size_;
};
Pool& pool() {
  static Pool* p = new Pool;  // never freed: pinned memory outlives static destruction order of CUDA
  return *p;
}

// Device scratch of one batch call, freed with the stream.
struct DevMem {
  void* p = nullptr;
  size_t cap = 0;
  ~DevMem() {
    if (p) cudaFree(p);
  }
  void alloc(size_t n, const char* what) { ck(cudaMalloc(&p, n ? n : 256), what); }
  // Grows only (cudaFree synchronises the device: avoided while batches overlap).
  void ensure(size_t n, const char* what) {
    if (n <= cap && p) return;
    if (p) cudaFree(p);
    p = nullptr;
    cap = 0;
    ck(cudaMalloc(&p, n ? n : 256), what);
    cap = n ? n : 256;
  }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
};

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

void* pinned_get(size_t n) {
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lk(p.mu);
    auto it = p.free_.lower_bound(n);
    if (it != p.free_.end() && it->first <= 2 * n + (64u << 20)) {  // reuse unless far too large
      void* b = it->second;
      p.free_.erase(it);
      return b;
    }
  }
  void* b = nullptr;
  ck(cudaHostAlloc(&b, n ? n : 1, cudaHostAllocDefault), "cudaHostAlloc");
  std::lock_guard<std::mutex> lk(p.mu);
  p.size_[b] = n ? n : 1;
  return b;
}

void pinned_put(void* b) {
  if (!b) return;
  Pool& p = pool();
  std::lock_guard<std::mutex> lk(p.mu);
  p.free_.emplace(p.size_.at(b), b);
}

// ---- batched encode ------------------------------------------------------
struct BatchEncoder::Impl {
  std::vector<DevChunk> chunks;
  int level;
  std::atomic<uint64_t> gpu_bytes{0}, host_bytes{0};
  struct Batch {
    size_t first = 0, count = 0;
    int device = -1;
    enum { kIdle, kEncoding, kReady, kFailed } st = kIdle;
    void* pinned = nullptr;
    std::vector<uint64_t> off, size;
    std::vector<int> status;
    size_t remaining = 0;
    std::string err;
  };
  std::vector<Batch> batches;
  std::vector<size_t> batch_of;
  std::mutex mu;
  std::condition_variable cv;
  unsigned holding = 0;  // batches holding pinned memory

  // Level 3 (lane-context tables) is encoded by the CPU codec only.
  bool on_gpu(const DevChunk& c) const { return level != 3 && c.cd != TZ_DTYPE_BYTES && c.n % c.elem_size == 0; }

  void run(Batch& b) {
    ck(cudaSetDevice(b.device), "cudaSetDevice");  // this worker thread: the batch's device
    Stream st;
    std::vector<tz_cuda_compress_item> items;
    std::vector<size_t> idx;  // batch position of each item
    uint64_t out_total = 0;
    std::vector<uint64_t> out_off(b.count);
    for (size_t k = 0; k < b.count; ++k) {
      const DevChunk& c = chunks[b.first + k];
      if (!on_gpu(c)) continue;
      out_off[k] = out_total;
      out_total += up256(tz_compress_bound(c.n));
    }
    DevMem d_out, d_sizes, d_status, d_temp;
    d_out.alloc(out_total, "cudaMalloc (frames)");
    for (size_t k = 0; k < b.count; ++k) {
      const DevChunk& c = chunks[b.first + k];
      if (!on_gpu(c)) continue;
      items.push_back({c.src, c.n, c.cd, static_cast<uint8_t*>(d_out.p) + out_off[k], tz_compress_bound(c.n),
                       tz_cuda_prediction{}});
      idx.push_back(k);
    }
    b.off.assign(b.count, 0);
    b.size.assign(b.count, 0);
    b.status.assign(b.count, (int)TZ_ERROR_UNSUPPORTED);
    if (items.empty()) return;
    tz_params p{};
    p.level = level;
    p.block_elems = chunks[b.first + idx[0]].block_elems;  // one block size per batch (see the constructor)
    const size_t temp = tz_cuda_compress_temp_size(items.data(), items.size(), &p);
    d_temp.alloc(temp, "cudaMalloc (encode temp)");
    d_sizes.alloc(items.size() * sizeof(size_t), "cudaMalloc");
    d_status.alloc(items.size() * sizeof(int), "cudaMalloc");
    const size_t r = tz_cuda_compress(items.data(), items.size(), &p, d_temp.p, temp, static_cast<size_t*>(d_sizes.p),
                                      static_cast<int*>(d_status.p), st.s);
    if (tz_is_error(r)) throw std::runtime_error(std::string("GPU encode: ") + tz_get_error_name(r));
    std::vector<size_t> sizes(items.size());
    std::vector<int> status(items.size());
    ck(cudaMemcpyAsync(sizes.data(), d_sizes.p, sizes.size() * sizeof(size_t), cudaMemcpyDeviceToHost, st.s), "cudaMemcpy");
    ck(cudaMemcpyAsync(status.data(), d_status.p, status.size() * sizeof(int), cudaMemcpyDeviceToHost, st.s), "cudaMemcpy");
    ck(cudaStreamSynchronize(st.s), "GPU encode");
    uint64_t total = 0;
    for (size_t i = 0; i < items.size(); ++i)
      if (status[i] == TZ_OK) total += sizes[i];
    b.pinned = pinned_get(total);
    uint64_t at = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const size_t k = idx[i];
      b.status[k] = status[i];
      if (status[i] != TZ_OK) continue;
      b.off[k] = at;
      b.size[k] = sizes[i];
      ck(cudaMemcpyAsync(static_cast<uint8_t*>(b.pinned) + at, items[i].dst, sizes[i], cudaMemcpyDeviceToHost, st.s),
         "cudaMemcpy (frames)");
      at += sizes[i];
    }
    ck(cudaStreamSynchronize(st.s), "cudaMemcpy (frames)");
  }
};

BatchEncoder::BatchEncoder(std::vector<DevChunk> chunks, int level, uint64_t batch_bytes)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.chunks = std::move(chunks);
  m.level = level;
  m.batch_of.resize(m.chunks.size());
  int cur = -1;
  if (!m.chunks.empty() && cudaGetDevice(&cur) != cudaSuccess) cur = 0;
  for (auto& c : m.chunks)
    if (c.device < 0) c.device = cur;
  // A batch: chunks of one device, and (the GPU codec's parameters are per
  // call) one block size among the chunks the GPU takes.
  uint64_t acc = 0;
  unsigned batch_be = 0;  // block size of the batch's GPU chunks (0: none yet)
  for (size_t i = 0; i < m.chunks.size(); ++i) {
    const DevChunk& c = m.chunks[i];
    const bool gpu = m.on_gpu(c);
    if (m.batches.empty() || acc + c.n > batch_bytes || c.device != m.batches.back().device ||
        (gpu && batch_be && c.block_elems != batch_be)) {
      m.batches.emplace_back();
      m.batches.back().first = i;
      m.batches.back().device = c.device;
      acc = 0;
      batch_be = 0;
    }
    if (gpu) batch_be = c.block_elems;
    ++m.batches.back().count;
    ++m.batches.back().remaining;
    acc += m.chunks[i].n;
    m.batch_of[i] = m.batches.size() - 1;
  }
}

BatchEncoder::~BatchEncoder() {
  for (auto& b : impl_->batches) pinned_put(b.pinned);
}

size_t BatchEncoder::encode(size_t i, uint8_t* dst, size_t cap) {
  auto& m = *impl_;
  auto& b = m.batches[m.batch_of.at(i)];
  const size_t k = i - b.first;
  {
    std::unique_lock<std::mutex> lk(m.mu);
    if (b.st == Impl::Batch::kIdle) {
      // Bounded pinned memory: two batches at a time.
      m.cv.wait(lk, [&] { return m.holding < 2 || b.st != Impl::Batch::kIdle; });
      if (b.st == Impl::Batch::kIdle) {
        b.st = Impl::Batch::kEncoding;
        ++m.holding;
        lk.unlock();
        try {
          m.run(b);
          lk.lock();
          b.st = Impl::Batch::kReady;
        } catch (const std::exception& e) {
          lk.lock();
          b.st = Impl::Batch::kFailed;
          b.err = e.what();
        }
        m.cv.notify_all();
      }
    }
    m.cv.wait(lk, [&] { return b.st == Impl::Batch::kReady || b.st == Impl::Batch::kFailed; });
    if (b.st == Impl::Batch::kFailed) throw std::runtime_error(b.err);
  }
  size_t r;
  if (b.status[k] == TZ_OK) {
    if (b.size[k] > cap) throw std::runtime_error("GPU frame larger than its buffer");
    std::memcpy(dst, static_cast<uint8_t*>(b.pinned) + b.off[k], b.size[k]);
    r = b.size[k];
    m.gpu_bytes += m.chunks[i].n;
  } else if (b.status[k] == TZ_ERROR_UNSUPPORTED) {
    // Not on the GPU: host copy + CPU encode (same bitstream).
    const DevChunk& c = m.chunks[i];
    std::vector<uint8_t> host(c.n);
    ck(cudaSetDevice(b.device), "cudaSetDevice");
    ck(cudaMemcpy(host.data(), c.src, c.n, cudaMemcpyDeviceToHost), "cudaMemcpy");
    m.host_bytes += c.n;
    tz_params p{};
    p.dtype = c.cd;
    p.level = m.level;
    p.block_elems = c.block_elems;
    p.threads = 1;
    r = tz_compress(dst, cap, host.data(), c.n, &p);
  } else {
    throw std::runtime_error(std::string("GPU encode: ") + tz_error_code_name((tz_error_code)b.status[k]));
  }
  std::lock_guard<std::mutex> lk(m.mu);
  if (--b.remaining == 0) {
    pinned_put(b.pinned);
    b.pinned = nullptr;
    --m.holding;
    m.cv.notify_all();
  }
  return r;
}

uint64_t BatchEncoder::gpu_bytes() const { return impl_->gpu_bytes.load(); }
uint64_t BatchEncoder::host_bytes() const { return impl_->host_bytes.load(); }

// ---- device tensors of a container TensorWriter ---------------------------
WriterEncoder::WriterEncoder(int level) : level_(level) {}
WriterEncoder::~WriterEncoder() = default;

void WriterEncoder::add(tz::container::TensorWriter& w, const std::string& name, const std::string& dtype,
                        const std::vector<uint64_t>& shape, const void* data, uint64_t size, unsigned block_elems) {
  using tz::container::Error;
  using tz::container::ErrorKind;
  const std::string what = w.path() + ": tensor '" + name + "'";
  if (enc_) throw Error(ErrorKind::kUsage, what + ": added after the GPU encode started");
  tz_dtype cd = TZ_DTYPE_BYTES;
  if (!tz::container::codec_dtype_for(dtype, &cd)) throw Error(ErrorKind::kUsage, what + ": unknown dtype '" + dtype + "'");
  if (!block_elems) block_elems = tz::policy_block_elems(0, (uint8_t)cd);  // the codec's default
  int device = -1;
  if (size) {
    if (!data) throw Error(ErrorKind::kUsage, what + ": null device pointer");
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, data);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      throw Error(ErrorKind::kUsage, what + ": cannot use its memory on the GPU: " + cudaGetErrorString(e));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
      throw Error(ErrorKind::kUsage, what + ": not CUDA device memory");
    device = a.device;
  }
  // Registered first (it checks name, dtype, shape, size and block size);
  // the chunks follow the writer's chunk_bytes, one frame each.
  const size_t base = chunks_.size();
  w.add_encoder(
      name, dtype, shape, size,
      [this, base, what](uint64_t k, uint8_t* dst, size_t cap) -> size_t {
        if (!enc_) throw Error(ErrorKind::kInternal, what + ": GPU encode not started");
        try {
          return enc_->encode(base + k, dst, cap);
        } catch (const Error&) {
          throw;
        } catch (const std::runtime_error& e) {
          throw Error(ErrorKind::kInternal, what + ": " + e.what());
        }
      },
      level_, block_elems);
  const uint64_t chunk = w.chunk_bytes();
  const unsigned esz = std::max(1u, tz::container::dtype_bits(dtype) / 8);
  for (uint64_t off = 0; off < size; off += chunk)
    chunks_.push_back({static_cast<const uint8_t*>(data) + off, std::min<uint64_t>(chunk, size - off), cd, block_elems,
                       esz, device});
}

void WriterEncoder::start() {
  if (enc_) throw tz::container::Error(tz::container::ErrorKind::kUsage, "GPU encode started twice");
  enc_ = std::make_unique<BatchEncoder>(std::move(chunks_), level_);
}

uint64_t WriterEncoder::gpu_bytes() const { return enc_ ? enc_->gpu_bytes() : 0; }
uint64_t WriterEncoder::host_bytes() const { return enc_ ? enc_->host_bytes() : 0; }

// ---- batched decode into device memory -----------------------------------
// Two batches in flight: while the GPU decodes batch b (and its frames are
// copied to the device), the host reads batch b+1 into the other pinned
// buffer (or cuFile reads it into the other device buffer): load_frames.
namespace {
struct PinnedBuf {
  void* p = nullptr;
  size_t cap = 0;
  ~PinnedBuf() { pinned_put(p); }
  void ensure(size_t n) {
    if (n <= cap && p) return;
    pinned_put(p);
    p = nullptr;
    cap = 0;
    p = pinned_get(n);
    cap = n;
  }
};
// One of the two batches in flight; its buffers are kept and reused by the
// batch after next (they only grow).
struct DecodeBatch {
  size_t first = 0, last = 0;  // frames [first, last)
  std::vector<uint64_t> off;
  uint64_t total = 0;
  bool host = false;           // frames read into `pinned` (not cuFile)
  PinnedBuf pinned, meta;      // meta: per-frame decoded sizes, then statuses
  DevMem d_in, d_temp, d_sizes, d_status;
  std::vector<tz_cuda_decompress_item> items;
  cudaEvent_t done = nullptr;  // recorded after the decode and the copy of `meta`
  size_t* h_sizes() const { return static_cast<size_t*>(meta.p); }
  int* h_status() const { return reinterpret_cast<int*>(static_cast<size_t*>(meta.p) + items.size()); }
  ~DecodeBatch() {
    if (done) cudaEventDestroy(done);
  }
};

// Reads frames [first, last) (host: pread + xxh64 into pinned memory; GDS:
// cuFileRead into device memory) and queues copy + decode on the stream.
void launch_batch(DecodeBatch& b, std::vector<DevFrame>& frames, bool gds,
                  std::map<int, std::unique_ptr<tz::io::GdsFile>>& gfiles, cudaStream_t stream) {
  b.off.resize(b.last - b.first);
  b.items.clear();
  b.total = 0;
  b.host = !gds;
  for (size_t k = b.first; k < b.last; ++k) b.off[k - b.first] = b.total, b.total += up256(frames[k].size);
  b.d_in.ensure(b.total, "cudaMalloc (frames)");
  if (gds) {
    for (size_t k = b.first; k < b.last; ++k) {
      DevFrame& f = frames[k];
      const int fd = f.dfd >= 0 ? f.dfd : f.fd;
      auto& g = gfiles[fd];
      if (!g) g = std::make_unique<tz::io::GdsFile>(fd);
      if (const int e = g->read(static_cast<uint8_t*>(b.d_in.p) + b.off[k - b.first], f.size, f.offset))
        throw std::runtime_error(f.what + ": cuFileRead failed: " + std::strerror(e));
    }
  } else {
    b.pinned.ensure(b.total);
    for (size_t k = b.first; k < b.last; ++k) {
      DevFrame& f = frames[k];
      uint8_t* p = static_cast<uint8_t*>(b.pinned.p) + b.off[k - b.first];
      if (const int e = tz::io::pread_full(f.fd, p, f.size, f.offset))
        throw std::runtime_error(f.what + ": read failed: " + std::strerror(e));
      if (XXH64(p, f.size, 0) != f.xxh64) throw std::runtime_error("corrupt: " + f.what + ": checksum mismatch");
    }
    ck(cudaMemcpyAsync(b.d_in.p, b.pinned.p, b.total, cudaMemcpyHostToDevice, stream), "cudaMemcpy (frames)");
  }
  for (size_t k = b.first; k < b.last; ++k)
    b.items.push_back({static_cast<uint8_t*>(b.d_in.p) + b.off[k - b.first], frames[k].size, frames[k].dst,
                       frames[k].raw_size, tz_cuda_prediction{}});
  const size_t temp = tz_cuda_decompress_temp_size(b.items.data(), b.items.size());
  b.d_temp.ensure(temp, "cudaMalloc (decode temp)");
  b.d_sizes.ensure(b.items.size() * sizeof(size_t), "cudaMalloc");
  b.d_status.ensure(b.items.size() * sizeof(int), "cudaMalloc");
  const size_t r = tz_cuda_decompress(b.items.data(), b.items.size(), b.d_temp.p, temp,
                                      static_cast<size_t*>(b.d_sizes.p), static_cast<int*>(b.d_status.p), stream);
  if (tz_is_error(r)) throw std::runtime_error(std::string("GPU decode: ") + tz_get_error_name(r));
  // Results to pinned memory (so these copies do not block the host) and
  // an event: finish_batch waits for this batch only, not for the next one.
  const size_t n = b.items.size();
  b.meta.ensure(n * (sizeof(size_t) + sizeof(int)));
  ck(cudaMemcpyAsync(b.h_sizes(), b.d_sizes.p, n * sizeof(size_t), cudaMemcpyDeviceToHost, stream), "cudaMemcpy");
  ck(cudaMemcpyAsync(b.h_status(), b.d_status.p, n * sizeof(int), cudaMemcpyDeviceToHost, stream), "cudaMemcpy");
  if (!b.done) ck(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming), "cudaEventCreate");
  ck(cudaEventRecord(b.done, stream), "cudaEventRecord");
}

// Waits for the batch, checks every frame's status; frames the GPU cannot
// take (valid frames with zstd streams, its only TZ_ERROR_UNSUPPORTED) are
// decoded on the CPU and copied. Every other status is reported, never retried.
void finish_batch(DecodeBatch& b, std::vector<DevFrame>& frames) {
  ck(cudaEventSynchronize(b.done), "GPU decode");
  const size_t* sizes = b.h_sizes();
  const int* status = b.h_status();
  std::vector<uint8_t> host_frame, host_raw;
  for (size_t k = b.first; k < b.last; ++k) {
    const DevFrame& f = frames[k];
    const int s = status[k - b.first];
    if (s == TZ_OK && sizes[k - b.first] == f.raw_size) continue;
    if (s != TZ_ERROR_UNSUPPORTED)
      throw std::runtime_error("corrupt: " + f.what + ": GPU decode: " + tz_error_code_name((tz_error_code)s));
    const uint8_t* src;
    if (b.host) {
      src = static_cast<uint8_t*>(b.pinned.p) + b.off[k - b.first];
    } else {
      host_frame.resize(f.size);
      ck(cudaMemcpy(host_frame.data(), b.items[k - b.first].src, f.size, cudaMemcpyDeviceToHost), "cudaMemcpy");
      if (XXH64(host_frame.data(), f.size, 0) != f.xxh64)
        throw std::runtime_error("corrupt: " + f.what + ": checksum mismatch");
      src = host_frame.data();
    }
    tz_frame_info info{};
    if (tz_is_error(tz_frame_inspect(src, f.size, &info)) ||
        !tz::stream_kinds_use_zstd(info.stream_kind, (int)info.n_streams))
      throw std::runtime_error("corrupt: " + f.what + ": GPU decode: UNSUPPORTED for a frame without zstd streams");
    host_raw.resize(f.raw_size);
    const size_t d = tz_decompress(host_raw.data(), f.raw_size, src, f.size, 1);
    if (tz_is_error(d) || d != f.raw_size)
      throw std::runtime_error("corrupt: " + f.what + ": " + (tz_is_error(d) ? tz_get_error_name(d) : "wrong size"));
    ck(cudaMemcpy(f.dst, host_raw.data(), f.raw_size, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
}
}  // namespace

void load_frames(std::vector<DevFrame>& frames, bool gds) {
  constexpr uint64_t kBatch = 256ull << 20;  // compressed bytes per batch
  if (frames.empty()) return;
  Stream st;
  std::map<int, std::unique_ptr<tz::io::GdsFile>> gfiles;
  std::vector<std::pair<size_t, size_t>> ranges;  // frames [first, last) of each batch
  for (size_t i = 0; i < frames.size();) {
    size_t j = i;
    uint64_t total = 0;
    while (j < frames.size() && (j == i || total + up256(frames[j].size) <= kBatch)) total += up256(frames[j++].size);
    ranges.push_back({i, j});
    i = j;
  }
  // The batches are items of the ordered pipeline (common/ordered_pipeline.h)
  // on this one thread, two slots: issue reads batch b and queues its copy
  // and decode; read_ahead 2 issues batch b+1 (the stream runs its decode
  // after this one's) before work waits for batch b and checks it.
  DecodeBatch batch[2];
  tz::cpu::OrderedPipeline::Stages stages;
  stages.issue = [&](size_t b, size_t slot) {
    DecodeBatch& d = batch[slot];
    d.first = ranges[b].first;
    d.last = ranges[b].second;
    launch_batch(d, frames, gds, gfiles, st.s);
  };
  stages.work = [&](size_t, size_t slot, unsigned) { finish_batch(batch[slot], frames); };
  stages.read_ahead = 2;
  try {
    tz::cpu::OrderedPipeline pipeline(ranges.size(), 2, std::move(stages));
    pipeline.run(1u);
  } catch (...) {
    cudaStreamSynchronize(st.s);  // nothing in flight may outlive its buffers
    throw;
  }
  ck(cudaStreamSynchronize(st.s), "GPU decode");
}

}  // namespace tz::checkpoint::gpu

// AsyncSaver (doc/checkpoint.md, "Async saves"): save() copies the tensors
// into a staging area owned by the saver and runs the save pipeline on a
// background thread. A failed background save is reported: by wait(), or,
// if the caller did not wait, by the next save(), which then throws it
// instead of starting.
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "checkpoint_internal.hpp"

#ifdef TZ_CHECKPOINT_CUDA
#include <cuda_runtime_api.h>

#include "checkpoint_gpu.hpp"
#endif

namespace tz::checkpoint {

using namespace detail;

struct AsyncSaver::Impl {
  // Staging, reused across saves (not zero-filled); pinned (cudaHostAlloc,
  // from the process's pinned pool) when device tensors are staged, so the
  // device-to-host copies run at full DMA speed.
  uint8_t* arena = nullptr;
  uint64_t arena_size = 0;
  bool arena_pinned = false;
  void free_arena() {
    if (!arena) return;
#ifdef TZ_CHECKPOINT_CUDA
    if (arena_pinned) gpu::pinned_put(arena);
    else
#endif
      delete[] arena;
    arena = nullptr;
    arena_size = 0;
  }
  ~Impl() {
    join();
    std::lock_guard<std::mutex> lk(mu);
    if (err && unreported && log) {
      try {
        std::rethrow_exception(err);
      } catch (const std::exception& e) {
        log("asynchronous save to " + dir + " failed and nobody waited for it: " + e.what());
      } catch (...) {
      }
    }
    free_arena();
  }
  std::vector<TensorView> staged;
  std::thread th;
  mutable std::mutex mu;
  bool running = false, finished = false;
  std::exception_ptr err;
  bool unreported = false;  // err not yet thrown by wait() or save()
  std::string dir;          // of the last save
  std::function<void(const std::string&)> log;
  SaveStats stats;
  double stall = 0;

  void join() {
    if (th.joinable()) th.join();
  }
  // The previous save's error, if nobody was told of it yet, as an error of
  // the same kind naming that save.
  void throw_unreported() {
    std::lock_guard<std::mutex> lk(mu);
    if (!err || !unreported) return;
    unreported = false;
    try {
      std::rethrow_exception(err);
    } catch (const Error& e) {
      throw Error(e.kind(), "the previous asynchronous save to " + dir + " failed (nothing new was started): " + e.what());
    } catch (const std::exception& e) {
      throw Error(ErrorKind::kInternal,
                  "the previous asynchronous save to " + dir + " failed (nothing new was started): " + e.what());
    }
  }
  void allocate_arena(uint64_t total, bool want_pinned);
};

void AsyncSaver::Impl::allocate_arena(uint64_t total, bool want_pinned) {
  if (arena_size >= total && arena_pinned == want_pinned) return;
  free_arena();
#ifdef TZ_CHECKPOINT_CUDA
  if (want_pinned) {
    try {
      arena = static_cast<uint8_t*>(gpu::pinned_get(total));
    } catch (const std::runtime_error& e) {
      fail(ErrorKind::kInternal, e.what());
    }
  } else
#endif
    arena = resource_errors_as_error("staging " + std::to_string(total) + " bytes for an asynchronous save",
                                   [&] { return new uint8_t[total ? total : 1]; });
  arena_size = total;
  arena_pinned = want_pinned;
}

AsyncSaver::AsyncSaver() : impl_(std::make_unique<Impl>()) {}
AsyncSaver::~AsyncSaver() { impl_->join(); }

void AsyncSaver::save(const std::string& dir, std::span<const TensorView> tensors, const SaveOptions& opt) {
  impl_->join();  // one save in flight
  impl_->throw_unreported();
  const auto t0 = Clock::now();
  uint64_t total = 0;
  for (const auto& t : tensors) total += align64(t.size);
  bool want_pinned = false;
#ifdef TZ_CHECKPOINT_CUDA
  for (const auto& t : tensors) want_pinned = want_pinned || t.memory == Memory::kDevice;
#endif
  impl_->allocate_arena(total, want_pinned);
  resource_errors_as_error(dir, [&] { impl_->staged.assign(tensors.begin(), tensors.end()); });
  // Copy with `threads` threads, each taking a contiguous run of tensors of
  // about total/threads bytes (one thread cannot saturate memory bandwidth).
  std::vector<uint8_t*> dst(impl_->staged.size());
  {
    uint64_t off = 0;
    for (size_t i = 0; i < impl_->staged.size(); ++i) dst[i] = impl_->arena + off, off += align64(impl_->staged[i].size);
  }
  const unsigned nt = (unsigned)std::max<size_t>(1, std::min<size_t>(resolve_threads(opt.threads), impl_->staged.size()));
  std::vector<std::exception_ptr> errs(nt);
  auto copy_range = [&](unsigned w) {
    try {
      const uint64_t lo = total * w / nt, hi = total * (w + 1) / nt;
      for (size_t i = 0; i < impl_->staged.size(); ++i) {
        const uint64_t at = (uint64_t)(dst[i] - impl_->arena);
        if (at < lo || at >= hi) continue;
        const TensorView& t = impl_->staged[i];
#ifdef TZ_CHECKPOINT_CUDA
        if (t.memory == Memory::kDevice) {
          if (cudaMemcpy(dst[i], t.data, t.size, cudaMemcpyDeviceToHost) != cudaSuccess)
            fail(ErrorKind::kInternal, "tensor '" + t.name + "': cudaMemcpy failed");
          continue;
        }
#endif
        if (t.size) std::memcpy(dst[i], t.data, t.size);
      }
    } catch (...) {
      errs[w] = std::current_exception();
    }
  };
  {
    std::vector<std::thread> th;
    unsigned started = 1;
    try {
      for (unsigned w = 1; w < nt; ++w, ++started) th.emplace_back(copy_range, w);
    } catch (const std::system_error&) {  // fewer threads: this one copies the rest
    }
    copy_range(0);
    for (unsigned w = started; w < nt; ++w) copy_range(w);
    for (auto& x : th) x.join();
  }
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
  for (size_t i = 0; i < impl_->staged.size(); ++i) {
    impl_->staged[i].data = dst[i];
    impl_->staged[i].memory = Memory::kHost;
  }
  impl_->stall = secs(t0, Clock::now());
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->running = true;
    impl_->finished = false;
    impl_->err = nullptr;
    impl_->unreported = false;
    impl_->dir = dir;
    impl_->log = opt.log;
  }
  Impl* im = impl_.get();
  try {
    im->th = std::thread([im, dir, opt, t0] {
      SaveStats st;
      std::exception_ptr e;
      try {
        st = tz::checkpoint::save(dir, im->staged, opt);
        st.seconds = secs(t0, Clock::now());
        st.stall_seconds = im->stall;
      } catch (...) {
        e = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(im->mu);
      im->stats = st;
      im->err = e;
      im->unreported = e != nullptr;
      im->finished = true;
      im->running = false;
    });
  } catch (const std::system_error& e) {
    std::lock_guard<std::mutex> lk(im->mu);
    im->running = false;
    fail(ErrorKind::kInternal, dir + ": cannot start the background save: " + e.what());
  }
}

bool AsyncSaver::done() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return !impl_->running;
}

SaveStats AsyncSaver::wait() {
  impl_->join();
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (impl_->err) {
    impl_->unreported = false;
    std::rethrow_exception(impl_->err);
  }
  return impl_->stats;
}

std::exception_ptr AsyncSaver::error() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->finished ? impl_->err : nullptr;
}

}  // namespace tz::checkpoint

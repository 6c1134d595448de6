#include "write_queue.hpp"

#include <errno.h>
#include <unistd.h>

#include <map>

#ifdef TZ_IO_HAVE_URING
#include <liburing.h>
#endif

namespace tz::io {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kPosix: return "posix";
    case Backend::kUring: return "io_uring";
    default: return "auto";
  }
}

int pwrite_full(int fd, const void* p, size_t n, uint64_t off) {
  const auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, c, n, (off_t)off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;
    c += w, n -= (size_t)w, off += (uint64_t)w;
  }
  return 0;
}

int pread_full(int fd, void* p, size_t n, uint64_t off) {
  auto* c = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = ::pread(fd, c, n, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return EIO;
    c += r, n -= (size_t)r, off += (uint64_t)r;
  }
  return 0;
}

#ifdef TZ_IO_HAVE_URING
struct WriteQueue::Uring {
  io_uring ring{};
  std::map<uint64_t, Req> pending;  // by user_data, touched under mu_
  uint64_t next_id = 1;
};
#else
struct WriteQueue::Uring {};
#endif

WriteQueue::WriteQueue(int fd, Backend backend, unsigned threads, unsigned depth)
    : fd_(fd), backend_(backend), depth_(depth ? depth : 8) {
  if (backend_ == Backend::kAuto) backend_ = Backend::kUring;
#ifdef TZ_IO_HAVE_URING
  if (backend_ == Backend::kUring) {
    ring_ = std::make_unique<Uring>();
    if (io_uring_queue_init(depth_, &ring_->ring, 0) < 0) {
      ring_.reset();
      backend_ = Backend::kPosix;  // kernel without io_uring, or seccomp: fall back
    }
  }
#else
  if (backend_ == Backend::kUring) backend_ = Backend::kPosix;
#endif
  if (backend_ == Backend::kPosix) {
    for (unsigned i = 0; i < (threads ? threads : 1); ++i) threads_.emplace_back([this] { posix_loop(); });
  } else {
    threads_.emplace_back([this] { uring_loop(); });
  }
}

WriteQueue::~WriteQueue() {
  drain();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
#ifdef TZ_IO_HAVE_URING
  if (ring_) {
    // Wake the reaper with a no-op.
    std::lock_guard<std::mutex> lk(mu_);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    if (sqe) {
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, 0);
      io_uring_submit(&ring_->ring);
    }
  }
#endif
  for (auto& t : threads_) t.join();
#ifdef TZ_IO_HAVE_URING
  if (ring_) io_uring_queue_exit(&ring_->ring);
#endif
}

void WriteQueue::finish(Req& r, int err) {
  if (r.done) r.done();
  std::lock_guard<std::mutex> lk(mu_);
  if (err && !err_) err_ = err;
  --in_flight_;
  cv_.notify_all();
}

void WriteQueue::submit(uint64_t off, const void* p, size_t n, std::function<void()> done) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return in_flight_ < depth_; });
  ++in_flight_;
  if (err_) {  // a previous write failed: do not touch the disk any more
    lk.unlock();
    Req r{off, p, n, std::move(done)};
    finish(r, 0);
    return;
  }
#ifdef TZ_IO_HAVE_URING
  if (ring_) {
    const uint64_t id = ring_->next_id++;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    if (sqe) {
      io_uring_prep_write(sqe, fd_, p, (unsigned)n, off);
      io_uring_sqe_set_data64(sqe, id);
      ring_->pending.emplace(id, Req{off, p, n, std::move(done)});
      io_uring_submit(&ring_->ring);
      return;
    }
    // Ring full (cannot happen with in_flight_ <= depth_): write inline.
    lk.unlock();
    Req r{off, p, n, std::move(done)};
    finish(r, pwrite_full(fd_, p, n, off));
    return;
  }
#endif
  q_.push_back(Req{off, p, n, std::move(done)});
  cv_.notify_all();
}

void WriteQueue::posix_loop() {
  for (;;) {
    Req r;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      r = std::move(q_.front());
      q_.pop_front();
    }
    finish(r, pwrite_full(fd_, r.p, r.n, r.off));
  }
}

void WriteQueue::uring_loop() {
#ifdef TZ_IO_HAVE_URING
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(&ring_->ring, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) return;
    const uint64_t id = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_->ring, cqe);
    if (id == 0) {  // wake-up no-op from the destructor
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_ && ring_->pending.empty()) return;
      continue;
    }
    Req r;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = ring_->pending.find(id);
      r = std::move(it->second);
      ring_->pending.erase(it);
    }
    int err = 0;
    if (res < 0) err = -res;
    else if ((size_t)res < r.n)  // short write: finish it synchronously
      err = pwrite_full(fd_, static_cast<const uint8_t*>(r.p) + res, r.n - (size_t)res, r.off + (uint64_t)res);
    finish(r, err);
  }
#endif
}

int WriteQueue::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return in_flight_ == 0; });
  return err_;
}

int WriteQueue::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return err_;
}

}  // namespace tz::io

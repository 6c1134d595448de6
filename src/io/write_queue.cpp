#include "write_queue.hpp"

#include <errno.h>
#include <unistd.h>

#include "uring_ring.hpp"

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

struct WriteQueue::Uring : detail::UringRing<Req> {};

WriteQueue::WriteQueue(int fd, Backend backend, unsigned threads, unsigned depth)
    : fd_(fd), backend_(backend), depth_(depth ? depth : 8) {
  backend_ = detail::open_ring(backend_, depth_, &ring_);
  detail::start_threads(backend_ == Backend::kPosix ? (threads ? threads : 1) : 1,
                        [this] { backend_ == Backend::kPosix ? posix_loop() : uring_loop(); }, mu_, cv_, &stop_,
                        &ring_, &threads_);
}

WriteQueue::~WriteQueue() {
  drain();
  detail::stop_and_join(mu_, cv_, &stop_, &ring_, &threads_);
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
  Req r{off, p, n, std::move(done)};
  if (err_) {  // a previous write failed: do not touch the disk any more
    ++in_flight_;
    lk.unlock();
    finish(r, 0);
    return;
  }
  if (!ring_) {
    q_.push_back(std::move(r));  // may throw (no memory): nothing was counted yet
    ++in_flight_;
    cv_.notify_all();
    return;
  }
  const int rc = detail::submit_counted(*ring_, Uring::Op::kWrite, fd_, const_cast<void*>(p), n, off, r, &in_flight_, cv_);
  if (rc > 0) return;
  lk.unlock();
  if (rc < 0) {  // the ring refused it: the write fails (never waits forever)
    finish(r, -rc);
    return;
  }
  // Ring full (cannot happen with in_flight_ <= depth_): write inline.
  finish(r, pwrite_full(fd_, p, n, off));
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
  ring_->reap(mu_, stop_, [this](Req& r, int res) {
    int err = 0;
    if (res < 0) err = -res;
    else if ((size_t)res < r.n)  // short write: finish it synchronously
      err = pwrite_full(fd_, static_cast<const uint8_t*>(r.p) + res, r.n - (size_t)res, r.off + (uint64_t)res);
    finish(r, err);
  });
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

#include "read_queue.hpp"

#include <errno.h>
#include <unistd.h>

#include "uring_ring.hpp"

namespace tz::io {

int pread_upto(int fd, void* p, size_t n, uint64_t off, size_t* got) {
  auto* c = static_cast<uint8_t*>(p);
  *got = 0;
  while (*got < n) {
    const ssize_t r = ::pread(fd, c + *got, n - *got, (off_t)(off + *got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) break;
    *got += (size_t)r;
  }
  return 0;
}

struct ReadQueue::Uring : detail::UringRing<Req> {};

ReadQueue::ReadQueue(Backend backend, unsigned threads, unsigned depth)
    : backend_(backend), depth_(depth ? depth : 16) {
  // one entry more than reads in flight: room for the wake-up no-op
  backend_ = detail::open_ring(backend_, depth_ + 1, &ring_);
  detail::start_threads(backend_ == Backend::kPosix ? (threads ? threads : 1) : 1,
                        [this] { backend_ == Backend::kPosix ? posix_loop() : uring_loop(); }, mu_, cv_, &stop_,
                        &ring_, &threads_);
}

ReadQueue::~ReadQueue() {
  drain();
  detail::stop_and_join(mu_, cv_, &stop_, &ring_, &threads_);
}

void ReadQueue::finish(Req& r, int err, size_t got) {
  if (r.done) r.done(err, got);
  std::lock_guard<std::mutex> lk(mu_);
  --in_flight_;
  cv_.notify_all();
}

void ReadQueue::submit(int fd, uint64_t off, void* p, size_t n, std::function<void(int, size_t)> done) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return in_flight_ < depth_; });
  Req r{fd, off, p, n, std::move(done)};
  if (!ring_) {
    q_.push_back(std::move(r));  // may throw (no memory): nothing was counted yet
    ++in_flight_;
    cv_.notify_all();
    return;
  }
  const int rc = detail::submit_counted(*ring_, Uring::Op::kRead, fd, p, n, off, r, &in_flight_, cv_);
  if (rc > 0) return;
  lk.unlock();
  if (rc < 0) {  // the ring refused it: the request fails (never waits forever)
    finish(r, -rc, 0);
    return;
  }
  // No free entry (cannot happen with in_flight_ <= depth_): read inline.
  size_t got = 0;
  const int e = pread_upto(fd, p, n, off, &got);
  finish(r, e, got);
}

void ReadQueue::posix_loop() {
  for (;;) {
    Req r;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      r = std::move(q_.front());
      q_.pop_front();
    }
    size_t got = 0;
    const int e = pread_upto(r.fd, r.p, r.n, r.off, &got);
    finish(r, e, got);
  }
}

void ReadQueue::uring_loop() {
  ring_->reap(mu_, stop_, [this](Req& r, int res) {
    int err = 0;
    size_t got = 0;
    if (res < 0) {
      err = -res;
    } else {
      got = (size_t)res;
      if (got > 0 && got < r.n) {  // short read: the rest synchronously (stops at end of file)
        size_t more = 0;
        err = pread_upto(r.fd, static_cast<uint8_t*>(r.p) + got, r.n - got, r.off + got, &more);
        got += more;
      }
    }
    finish(r, err, got);
  });
}

void ReadQueue::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return in_flight_ == 0; });
}

}  // namespace tz::io

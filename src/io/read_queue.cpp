#include "read_queue.hpp"

#include <errno.h>
#include <unistd.h>

#include <map>

#ifdef TZ_IO_HAVE_URING
#include <liburing.h>
#endif

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

#ifdef TZ_IO_HAVE_URING
struct ReadQueue::Uring {
  io_uring ring{};
  std::map<uint64_t, Req> pending;  // by user_data, touched under mu_
  uint64_t next_id = 1;
};
#else
struct ReadQueue::Uring {};
#endif

ReadQueue::ReadQueue(Backend backend, unsigned threads, unsigned depth)
    : backend_(backend), depth_(depth ? depth : 16) {
  if (backend_ == Backend::kAuto) backend_ = Backend::kUring;
#ifdef TZ_IO_HAVE_URING
  if (backend_ == Backend::kUring) {
    ring_ = std::make_unique<Uring>();
    if (io_uring_queue_init(depth_ + 1, &ring_->ring, 0) < 0) {
      ring_.reset();
      backend_ = Backend::kPosix;  // no io_uring here (old kernel, seccomp): pread threads
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

ReadQueue::~ReadQueue() {
  drain();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
#ifdef TZ_IO_HAVE_URING
    if (ring_) {  // wake the reaper with a no-op
      if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring)) {
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, 0);
        io_uring_submit(&ring_->ring);
      }
    }
#endif
  }
  for (auto& t : threads_) t.join();
#ifdef TZ_IO_HAVE_URING
  if (ring_) io_uring_queue_exit(&ring_->ring);
#endif
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
  ++in_flight_;
#ifdef TZ_IO_HAVE_URING
  if (ring_) {
    if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring)) {
      const uint64_t id = ring_->next_id++;
      io_uring_prep_read(sqe, fd, p, (unsigned)n, off);
      io_uring_sqe_set_data64(sqe, id);
      ring_->pending.emplace(id, Req{fd, off, p, n, std::move(done)});
      io_uring_submit(&ring_->ring);
      return;
    }
    lk.unlock();  // no free entry (cannot happen with in_flight_ <= depth_): read inline
    Req r{fd, off, p, n, std::move(done)};
    size_t got = 0;
    const int e = pread_upto(fd, p, n, off, &got);
    finish(r, e, got);
    return;
  }
#endif
  q_.push_back(Req{fd, off, p, n, std::move(done)});
  cv_.notify_all();
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
#ifdef TZ_IO_HAVE_URING
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(&ring_->ring, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) return;
    const uint64_t id = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_->ring, cqe);
    if (id == 0) {
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
  }
#endif
}

void ReadQueue::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return in_flight_ == 0; });
}

}  // namespace tz::io

// The io_uring part shared by WriteQueue and ReadQueue (internal to
// tensorzip_io; liburing stays out of this header): ring set-up with its
// failure reason, one submission per request, the requests in flight by id,
// the reaper loop, the wake-up no-op that lets a queue stop its reaper, and
// teardown.
//
// Threading: init(), submit() and wake() are called under the owning queue's
// mutex (a ring's submission side has one producer at a time); reap() runs
// on the queue's single reaper thread (the completion side has one
// consumer) and takes that same mutex to look requests up. Built without
// liburing (TZ_IO_HAVE_URING undefined), init() fails with -ENOSYS and the
// queues use their POSIX threads instead.
#pragma once

#include <errno.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "write_queue.hpp"  // Backend

namespace tz::io::detail {

// The liburing calls, on one ring. Request ids are non-zero; id 0 is the
// wake-up no-op.
class UringCore {
 public:
  enum class Op { kRead, kWrite };
  UringCore();
  ~UringCore();  // io_uring_queue_exit (after the reaper thread was joined)
  UringCore(const UringCore&) = delete;
  UringCore& operator=(const UringCore&) = delete;

  // Sets up a ring of `entries` submission entries: 0, or a negative errno
  // (no io_uring in this kernel, seccomp, -ENOSYS without liburing); the
  // ring is then unusable and the caller falls back to POSIX threads.
  int init(unsigned entries);
  // Prepares and submits one read or write of n bytes at off (n is passed
  // to the kernel as an unsigned length). False when no submission entry
  // is free; nothing was queued then.
  bool prep_submit(Op op, int fd, void* p, size_t n, uint64_t off, uint64_t id);
  // Submits a no-op with id 0 to wake the reaper (nothing if the ring is full).
  void wake();
  // Waits for one completion and consumes it: 0 with *id and *res (bytes,
  // or -errno) set, or the negative errno of the wait.
  int wait(uint64_t* id, int* res);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A ring plus the queue's requests in flight on it (by id; guarded by the
// queue's mutex).
template <class Req>
class UringRing : public UringCore {
 public:
  // Queues r (moved into the table of requests in flight) when a submission
  // entry is free; else returns false and leaves r with the caller.
  bool submit(Op op, int fd, void* p, size_t n, uint64_t off, Req& r) {
    const uint64_t id = next_id_;
    if (!prep_submit(op, fd, p, n, off, id)) return false;
    ++next_id_;
    pending_.emplace(id, std::move(r));
    return true;
  }

  // The reaper loop: for each completed request, takes it out of the table
  // (under mu) and runs on_done(req, res) outside the lock, res being the
  // byte count or -errno. On a wake-up it returns once *stop is set (read
  // under mu) and nothing is in flight. Also returns if waiting fails.
  template <class Done>
  void reap(std::mutex& mu, const bool& stop, Done&& on_done) {
    for (;;) {
      uint64_t id = 0;
      int res = 0;
      const int rc = wait(&id, &res);
      if (rc == -EINTR) continue;
      if (rc < 0) return;
      if (id == 0) {  // wake-up no-op from the queue's destructor
        std::lock_guard<std::mutex> lk(mu);
        if (stop && pending_.empty()) return;
        continue;
      }
      Req r;
      {
        std::lock_guard<std::mutex> lk(mu);
        auto it = pending_.find(id);
        r = std::move(it->second);
        pending_.erase(it);
      }
      on_done(r, res);
    }
  }

 private:
  std::map<uint64_t, Req> pending_;
  uint64_t next_id_ = 1;
};

// A queue's back-end choice: kAuto means io_uring, and io_uring falls back
// to kPosix (*ring left null) where a ring of `entries` cannot be set up.
template <class Ring>
Backend open_ring(Backend b, unsigned entries, std::unique_ptr<Ring>* ring) {
  if (b == Backend::kAuto) b = Backend::kUring;
  if (b == Backend::kUring) {
    *ring = std::make_unique<Ring>();
    if ((*ring)->init(entries) < 0) {  // old kernel, seccomp, built without liburing
      ring->reset();
      b = Backend::kPosix;
    }
  }
  return b;
}

// A queue's teardown, once drained: sets *stop under mu, wakes the POSIX
// workers (cv) and the reaper (the wake-up no-op), joins every thread, then
// closes the ring.
template <class Ring>
void stop_and_join(std::mutex& mu, std::condition_variable& cv, bool* stop, std::unique_ptr<Ring>* ring,
                   std::vector<std::thread>* threads) {
  {
    std::lock_guard<std::mutex> lk(mu);
    *stop = true;
    cv.notify_all();
    if (*ring) (*ring)->wake();
  }
  for (auto& t : *threads) t.join();
  ring->reset();  // io_uring_queue_exit
}

}  // namespace tz::io::detail

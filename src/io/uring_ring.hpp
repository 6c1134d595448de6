// The io_uring part shared by WriteQueue and ReadQueue (internal to
// tensorzip_io; liburing stays out of this header): ring set-up with its
// failure reason, one submission per request, the requests in flight by id,
// the reaper loop, the wake-up that lets a queue stop its reaper, and
// teardown.
//
// Threading: init(), submit() and wake() are called under the owning queue's
// mutex (a ring's submission side has one producer at a time); reap() runs
// on the queue's single reaper thread (the completion side has one
// consumer) and takes that same mutex to look requests up. Built without
// liburing (TZ_IO_HAVE_URING undefined), init() fails with -ENOSYS and the
// queues use their POSIX threads instead.
//
// Faults: a submission the kernel refuses is retried while the error is
// transient (EAGAIN, EBUSY, EINTR; about 100 ms in all), then the request
// fails with that errno and so does every later one (the ring is broken);
// a failing wait for completions likewise fails every request in flight.
// Nothing waits forever. testing::inject_uring_fault makes either happen.
#pragma once

#include <errno.h>

#include <chrono>
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

// The liburing calls, on one ring. Request ids are non-zero; id 0 is a
// wake-up (or a neutralised submission).
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
  // to the kernel as an unsigned length): 1 when submitted; 0 when no
  // submission entry is free (nothing was queued); a negative errno when
  // the kernel refused the submission past the transient retries (the entry
  // was turned into a no-op with id 0, so it can never run later).
  int prep_submit(Op op, int fd, void* p, size_t n, uint64_t off, uint64_t id);
  // Wakes the reaper: its wait() returns with id 0. Needs no submission
  // entry (an eventfd), so it works on a broken ring too.
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
  // Queues r (moved into the table of requests in flight): 1. When no
  // submission entry is free: 0, r left with the caller. When the ring
  // refused it, now or earlier (broken): a negative errno, r left with the
  // caller, who fails the request.
  int submit(Op op, int fd, void* p, size_t n, uint64_t off, Req& r) {
    if (broken_) return -broken_;
    const uint64_t id = next_id_;
    auto it = pending_.emplace(id, std::move(r)).first;  // before the kernel can complete it
    const int rc = prep_submit(op, fd, p, n, off, id);
    if (rc <= 0) {
      r = std::move(it->second);
      pending_.erase(it);
      if (rc < 0) broken_ = -rc;
      return rc;
    }
    ++next_id_;
    return 1;
  }

  // The reaper loop: for each completed request, takes it out of the table
  // (under mu) and runs on_done(req, res) outside the lock, res being the
  // byte count or -errno. On a wake-up it returns once *stop is set (read
  // under mu) and nothing is in flight. If waiting keeps failing, every
  // request in flight gets on_done(req, -errno), the ring is broken (later
  // submits fail) and the loop returns.
  template <class Done>
  void reap(std::mutex& mu, const bool& stop, Done&& on_done) {
    int failures = 0;
    for (;;) {
      uint64_t id = 0;
      int res = 0;
      const int rc = wait(&id, &res);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        if (++failures < kWaitRetries && (rc == -EAGAIN || rc == -EBUSY)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        std::map<uint64_t, Req> lost;
        {
          std::lock_guard<std::mutex> lk(mu);
          broken_ = -rc;
          lost.swap(pending_);
        }
        for (auto& [lid, r] : lost) on_done(r, rc);
        return;
      }
      failures = 0;
      if (id == 0) {  // wake-up from the queue's destructor
        std::lock_guard<std::mutex> lk(mu);
        if (stop && pending_.empty()) return;
        continue;
      }
      Req r;
      {
        std::lock_guard<std::mutex> lk(mu);
        auto it = pending_.find(id);
        if (it == pending_.end()) continue;  // not ours (cannot happen): nothing to finish
        r = std::move(it->second);
        pending_.erase(it);
      }
      on_done(r, res);
    }
  }

 private:
  static constexpr int kWaitRetries = 100;
  std::map<uint64_t, Req> pending_;
  uint64_t next_id_ = 1;
  int broken_ = 0;  // errno that broke the ring (guarded by the queue's mutex)
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
// workers (cv) and the reaper (wake()), joins every thread, then
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

// A queue's submission of one request to its ring, counted in *in_flight
// (under the queue's mutex): if the ring cannot take it for want of memory
// for its table of requests, nothing was submitted, so the count is undone,
// the waiters on cv are woken and the exception goes on. Returns the ring's
// result (> 0 submitted, 0 no free entry, < 0 refused: -errno).
template <class Ring, class Req>
int submit_counted(Ring& ring, UringCore::Op op, int fd, void* p, size_t n, uint64_t off, Req& r,
                   size_t* in_flight, std::condition_variable& cv) {
  ++*in_flight;
  try {
    return ring.submit(op, fd, p, n, off, r);
  } catch (...) {
    --*in_flight;
    cv.notify_all();
    throw;
  }
}

// Starts a queue's n threads running loop; if one cannot start, stops and
// joins those that did (stop_and_join) and rethrows, so that no joinable
// thread is left to be destroyed.
template <class Ring, class Loop>
void start_threads(unsigned n, Loop loop, std::mutex& mu, std::condition_variable& cv, bool* stop,
                   std::unique_ptr<Ring>* ring, std::vector<std::thread>* threads) {
  try {
    for (unsigned i = 0; i < n; ++i) threads->emplace_back(loop);
  } catch (...) {
    stop_and_join(mu, cv, stop, ring, threads);
    throw;
  }
}

}  // namespace tz::io::detail

namespace tz::io::testing {
// Fault injection for tests: after `skip` more calls succeed, the next
// `count` (0: every later one) io_uring submissions (kSubmit) or completion
// waits (kWait) of this process fail with -err, as a refusing kernel would
// make them. clear_uring_faults() disarms both.
enum class UringFault { kSubmit, kWait };
void inject_uring_fault(UringFault f, int err, unsigned skip = 0, unsigned count = 0);
void clear_uring_faults();
}  // namespace tz::io::testing

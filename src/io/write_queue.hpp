// Storage back ends of the I/O engine: positional writes and reads on one
// file descriptor, issued asynchronously so that a caller (the checkpoint
// writer) can keep encoding while earlier chunks are on their way to disk.
//
//   kPosix: a pool of threads, each doing pwrite/pread (works everywhere).
//   kUring: io_uring (liburing) when built with it (TZ_IO_HAVE_URING) and the
//           kernel allows it; falls back to kPosix otherwise.
// Reads: read_queue.hpp.
// Buffers are the caller's: they must stay alive until their completion
// callback has run.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tz::io {

enum class Backend { kAuto = 0, kPosix = 1, kUring = 2 };
const char* backend_name(Backend b);

// Whole-buffer pwrite/pread, retrying short transfers and EINTR. Return 0 or
// an errno value (EIO for an unexpected end of file on read).
int pwrite_full(int fd, const void* p, size_t n, uint64_t off);
int pread_full(int fd, void* p, size_t n, uint64_t off);

class WriteQueue {
 public:
  // threads: posix worker threads (>= 1); depth: io_uring queue depth.
  WriteQueue(int fd, Backend backend, unsigned threads = 2, unsigned depth = 8);
  ~WriteQueue();  // drains (ignoring errors)
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  Backend backend() const { return backend_; }
  // Queues a write of [p, p+n) at off; `done` runs (on an I/O thread) after
  // the write finished or failed. Never blocks on the disk, but blocks while
  // `depth` writes are already queued (bounded queue).
  void submit(uint64_t off, const void* p, size_t n, std::function<void()> done);
  // Waits for every queued write. Returns the first errno seen (0 if none).
  int drain();
  // First errno of any completed write so far (0 if none).
  int error() const;

 private:
  struct Req {
    uint64_t off;
    const void* p;
    size_t n;
    std::function<void()> done;
  };
  void posix_loop();
  void uring_loop();
  void finish(Req& r, int err);

  int fd_;
  Backend backend_;
  unsigned depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Req> q_;
  size_t in_flight_ = 0;
  bool stop_ = false;
  int err_ = 0;
  std::vector<std::thread> threads_;
  struct Uring;
  std::unique_ptr<Uring> ring_;
};

}  // namespace tz::io

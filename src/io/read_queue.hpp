// Asynchronous positional reads for restore: io_uring (liburing) when built
// with it and the kernel allows it, else a pool of pread threads. The reads
// of frames k+1.. are in flight while workers decode frame k.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "write_queue.hpp"

namespace tz::io {

class ReadQueue {
 public:
  // threads: pread workers (posix back end); depth: reads in flight.
  explicit ReadQueue(Backend backend, unsigned threads = 2, unsigned depth = 16);
  ~ReadQueue();  // waits for every queued read
  ReadQueue(const ReadQueue&) = delete;
  ReadQueue& operator=(const ReadQueue&) = delete;

  Backend backend() const { return backend_; }
  // Queues a read of up to n bytes at `off` of fd into p. done(err, got)
  // runs on an I/O thread: err 0 and got the bytes read (fewer than n only at
  // end of file), or an errno value. Blocks while `depth` reads are queued.
  // The submitting thread must stay alive until its reads completed (call
  // drain() before it exits): io_uring finishes buffered reads that missed
  // the page cache through task work of the submitting thread, and fails
  // them (EFAULT) once that thread is gone.
  void submit(int fd, uint64_t off, void* p, size_t n, std::function<void(int err, size_t got)> done);
  void drain();

 private:
  struct Req {
    int fd;
    uint64_t off;
    void* p;
    size_t n;
    std::function<void(int, size_t)> done;
  };
  void posix_loop();
  void uring_loop();
  void finish(Req& r, int err, size_t got);

  Backend backend_;
  unsigned depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Req> q_;
  size_t in_flight_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
  struct Uring;
  std::unique_ptr<Uring> ring_;
};

// pread until n bytes or end of file; returns 0 or errno, bytes in *got.
int pread_upto(int fd, void* p, size_t n, uint64_t off, size_t* got);

}  // namespace tz::io

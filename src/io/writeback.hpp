// Early writeback of a file written front to back with buffered writes and
// made durable by one fsync at the end (the CLI's outputs, TensorWriter's
// files): every Writeback::kChunk bytes, the range written since the last
// time is queued for writeback (Linux sync_file_range with
// SYNC_FILE_RANGE_WRITE, which starts the writes and does not wait for
// them). The disk then writes while the codec still runs, and the final
// fsync waits for the last chunk only (measured on this project's VMs: a
// 48 MB output's fsync 24 -> 3 ms, bench/experiments/notebook.md). Durability and error
// reporting stay with the fsync: this is a hint and its result is ignored.
// Elsewhere than Linux it does nothing.
#pragma once

#include <fcntl.h>

#include <cstdint>

namespace tz::io {

class Writeback {
 public:
  static constexpr uint64_t kChunk = 8u << 20;
  // Bytes [0, end) of fd are written (end may only grow; a smaller one is
  // ignored).
  void written_to(int fd, uint64_t end) {
    if (end < from_ + kChunk) return;
    start(fd, from_, end - from_);
    from_ = end;
  }
  // Queues bytes [off, off + n) of fd, now (a writer of ranges in any order).
  // n = 0 queues nothing (sync_file_range would take it as "to the end").
  static void start(int fd, uint64_t off, uint64_t n) {
    if (n == 0) return;
#if defined(__linux__)
    (void)::sync_file_range(fd, (off64_t)off, (off64_t)n, SYNC_FILE_RANGE_WRITE);
#else
    (void)fd, (void)off, (void)n;
#endif
  }

 private:
  uint64_t from_ = 0;  // bytes before this are queued already
};

}  // namespace tz::io

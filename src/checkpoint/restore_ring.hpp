// Restore's read-ahead ring (doc/checkpoint.md, "Restore"): the frames are
// items of the project's ordered pipeline (src/common/ordered_pipeline.h); its
// issue stage queues each frame's read, in order, through the src/io read
// queue (io_uring, or pread threads) into the slot's 4 KiB-aligned buffer,
// and its work stage, on `workers` threads, hands the frame to the caller's
// consumer. So the reads of frames k+1.. are in flight while frame k is
// decoded, and memory is bounded by the pipeline's window of slots.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "../io/write_queue.hpp"  // Backend

namespace tz::checkpoint::detail {

struct FrameRead {
  int fd = -1;         // buffered descriptor of the frame's file
  int dfd = -1;        // O_DIRECT descriptor, -1: none
  uint64_t offset = 0; // the stored frame
  uint64_t size = 0;   // 0: nothing to read (the consumer gets a null pointer)
};

// Reads every frame of `frames` and calls consume(i, bytes, worker) for
// frame i from one of `workers` threads (worker in [0, workers); one
// worker's calls never overlap), the lowest frame read first. With direct_ok set and a dfd, reads are the
// 4 KiB-aligned ranges around the frame with O_DIRECT; where the file
// system refuses the alignment (EINVAL), direct_ok is cleared and the frame
// is read buffered. Read errors throw Error naming describe(i) (kCorrupt for
// EIO or a short file, else kIO); the first exception of any thread stops
// the others and is rethrown here. *backend names the read back end used.
void read_frames_ahead(std::span<const FrameRead> frames, unsigned workers, tz::io::Backend io,
                       std::atomic<bool>& direct_ok, std::string* backend,
                       const std::function<std::string(size_t)>& describe,
                       const std::function<void(size_t, const uint8_t*, unsigned)>& consume);

}  // namespace tz::checkpoint::detail

// The I/O engine's write queue (write_queue.hpp: pwrite thread pool or
// io_uring) as a sink of the container's TensorWriter (tensorzip/container.hpp).
// Header-only so that src/io does not depend on the container library; used
// by the checkpoint engine's rank files and the Python TensorWriter binding.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "tensorzip/container.hpp"
#include "write_queue.hpp"
#include "writeback.hpp"

namespace tz::io {

class QueueSink final : public tz::container::Sink {
 public:
  // writeback: each completed write's range is queued for writeback at once
  // (Writeback::start; buffered files, which the writer fsyncs at the end:
  // give !direct of the SinkFactory).
  QueueSink(int fd, Backend b, unsigned threads, unsigned depth, bool writeback = false)
      : q_(fd, b, threads, depth), fd_(fd), writeback_(writeback) {}
  void write(uint64_t off, const void* p, size_t n, std::function<void()> done) override {
    if (!writeback_) {
      q_.submit(off, p, n, std::move(done));
      return;
    }
    q_.submit(off, p, n, [fd = fd_, off, n, done = std::move(done)] {
      Writeback::start(fd, off, n);
      if (done) done();
    });
  }
  int drain() override { return q_.drain(); }
  int error() const override { return q_.error(); }
  std::string name() const override { return backend_name(q_.backend()); }

 private:
  WriteQueue q_;
  int fd_;
  bool writeback_;
};

}  // namespace tz::io

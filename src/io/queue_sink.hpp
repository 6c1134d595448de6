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

namespace tz::io {

class QueueSink final : public tz::container::Sink {
 public:
  QueueSink(int fd, Backend b, unsigned threads, unsigned depth) : q_(fd, b, threads, depth) {}
  void write(uint64_t off, const void* p, size_t n, std::function<void()> done) override {
    q_.submit(off, p, n, std::move(done));
  }
  int drain() override { return q_.drain(); }
  int error() const override { return q_.error(); }
  std::string name() const override { return backend_name(q_.backend()); }

 private:
  WriteQueue q_;
};

}  // namespace tz::io

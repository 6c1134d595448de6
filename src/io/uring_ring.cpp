#include "uring_ring.hpp"

#ifdef TZ_IO_HAVE_URING
#include <liburing.h>
#endif

namespace tz::io::detail {

#ifdef TZ_IO_HAVE_URING

struct UringCore::Impl {
  io_uring ring{};
  bool live = false;
};

UringCore::UringCore() : impl_(std::make_unique<Impl>()) {}

UringCore::~UringCore() {
  if (impl_->live) io_uring_queue_exit(&impl_->ring);
}

int UringCore::init(unsigned entries) {
  const int rc = io_uring_queue_init(entries, &impl_->ring, 0);
  impl_->live = rc >= 0;
  return rc < 0 ? rc : 0;
}

bool UringCore::prep_submit(Op op, int fd, void* p, size_t n, uint64_t off, uint64_t id) {
  io_uring_sqe* sqe = io_uring_get_sqe(&impl_->ring);
  if (!sqe) return false;
  if (op == Op::kRead) io_uring_prep_read(sqe, fd, p, (unsigned)n, off);
  else io_uring_prep_write(sqe, fd, p, (unsigned)n, off);
  io_uring_sqe_set_data64(sqe, id);
  io_uring_submit(&impl_->ring);
  return true;
}

void UringCore::wake() {
  if (io_uring_sqe* sqe = io_uring_get_sqe(&impl_->ring)) {
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, 0);
    io_uring_submit(&impl_->ring);
  }
}

int UringCore::wait(uint64_t* id, int* res) {
  io_uring_cqe* cqe = nullptr;
  const int rc = io_uring_wait_cqe(&impl_->ring, &cqe);
  if (rc < 0) return rc;
  *id = io_uring_cqe_get_data64(cqe);
  *res = cqe->res;
  io_uring_cqe_seen(&impl_->ring, cqe);
  return 0;
}

#else  // built without liburing: init() fails, the queues use POSIX threads

struct UringCore::Impl {};
UringCore::UringCore() = default;
UringCore::~UringCore() = default;
int UringCore::init(unsigned) { return -ENOSYS; }
bool UringCore::prep_submit(Op, int, void*, size_t, uint64_t, uint64_t) { return false; }
void UringCore::wake() {}
int UringCore::wait(uint64_t*, int*) { return -ENOSYS; }

#endif

}  // namespace tz::io::detail

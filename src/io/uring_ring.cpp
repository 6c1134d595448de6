#include "uring_ring.hpp"

#include <atomic>

#ifdef TZ_IO_HAVE_URING
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#endif

namespace tz::io::testing {
namespace {
struct Fault {
  std::atomic<int> err{0};
  std::atomic<unsigned> skip{0};
  std::atomic<unsigned> count{0};  // 0: every call once armed
  std::atomic<bool> armed{false};
};
Fault g_faults[2];
}  // namespace

void inject_uring_fault(UringFault f, int err, unsigned skip, unsigned count) {
  Fault& x = g_faults[(int)f];
  x.armed = false;
  x.err = err;
  x.skip = skip;
  x.count = count;
  x.armed = true;
}

void clear_uring_faults() {
  for (auto& x : g_faults) x.armed = false;
}

// The injected failure of this call (-errno), or 0.
int take_fault(UringFault f) {
  Fault& x = g_faults[(int)f];
  if (!x.armed.load(std::memory_order_acquire)) return 0;
  unsigned s = x.skip.load();
  while (s > 0)
    if (x.skip.compare_exchange_weak(s, s - 1)) return 0;
  unsigned c = x.count.load();
  if (c == 0) return -x.err.load();
  while (c > 0)
    if (x.count.compare_exchange_weak(c, c - 1)) {
      if (c == 1) x.armed = false;
      return -x.err.load();
    }
  return 0;
}

}  // namespace tz::io::testing

namespace tz::io::detail {

using tz::io::testing::UringFault;
using tz::io::testing::take_fault;

#ifdef TZ_IO_HAVE_URING

struct UringCore::Impl {
  io_uring ring{};
  bool live = false;
  int wake_fd = -1;  // eventfd: wake() needs no submission entry
};

UringCore::UringCore() : impl_(std::make_unique<Impl>()) {}

UringCore::~UringCore() {
  if (impl_->live) io_uring_queue_exit(&impl_->ring);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

int UringCore::init(unsigned entries) {
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl_->wake_fd < 0) return -errno;
  const int rc = io_uring_queue_init(entries, &impl_->ring, 0);
  impl_->live = rc >= 0;
  return rc < 0 ? rc : 0;
}

int UringCore::prep_submit(Op op, int fd, void* p, size_t n, uint64_t off, uint64_t id) {
  io_uring_sqe* sqe = io_uring_get_sqe(&impl_->ring);
  if (!sqe) return 0;
  if (op == Op::kRead) io_uring_prep_read(sqe, fd, p, (unsigned)n, off);
  else io_uring_prep_write(sqe, fd, p, (unsigned)n, off);
  io_uring_sqe_set_data64(sqe, id);
  // One entry per submission, so a refused submission consumed nothing: the
  // entry is still ours until the next io_uring_enter. Transient refusals
  // (no memory or resources right now, a completion queue to drain first)
  // are retried while the reaper drains completions.
  int rc = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    rc = take_fault(UringFault::kSubmit);
    if (rc == 0) rc = io_uring_submit(&impl_->ring);
    if (rc >= 0) return 1;
    if (rc != -EAGAIN && rc != -EBUSY && rc != -EINTR) break;
    if (rc != -EINTR) ::usleep(1000);
  }
  // Refused for good: the entry must never run (its buffer goes back to the
  // caller), so it becomes a no-op that the reaper ignores.
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data64(sqe, 0);
  return rc;
}

void UringCore::wake() {
  const uint64_t one = 1;
  while (::write(impl_->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

int UringCore::wait(uint64_t* id, int* res) {
  if (const int f = take_fault(UringFault::kWait)) return f;
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(&impl_->ring, &cqe) == 0 && cqe) {
      *id = io_uring_cqe_get_data64(cqe);
      *res = cqe->res;
      io_uring_cqe_seen(&impl_->ring, cqe);
      return 0;
    }
    // Completions and wake-ups: the ring's fd is readable while its
    // completion queue holds entries.
    pollfd fds[2] = {{impl_->ring.ring_fd, POLLIN, 0}, {impl_->wake_fd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!::read(impl_->wake_fd, &v, sizeof v);
      *id = 0;
      *res = 0;
      return 0;
    }
  }
}

#else  // built without liburing: init() fails, the queues use POSIX threads

struct UringCore::Impl {};
UringCore::UringCore() = default;
UringCore::~UringCore() = default;
int UringCore::init(unsigned) { return -ENOSYS; }
int UringCore::prep_submit(Op, int, void*, size_t, uint64_t, uint64_t) { return 0; }
void UringCore::wake() {}
int UringCore::wait(uint64_t*, int*) { return -ENOSYS; }

#endif

}  // namespace tz::io::detail

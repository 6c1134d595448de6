// WriteQueue / ReadQueue (src/io) on both back ends: what is written is read
// back, reads stop at end of file, an error goes to the request that caused
// it (and nowhere else), and a queue destroyed with requests in flight runs
// every completion before it returns.
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "read_queue.hpp"
#include "uring_ring.hpp"  // fault injection
#include "write_queue.hpp"

namespace io = tz::io;

namespace {

struct TempFile {
  std::string path;
  TempFile() {
    char tmpl[] = "/tmp/tz_io_test_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    ::close(fd);
    path = tmpl;
  }
  ~TempFile() { ::unlink(path.c_str()); }
};

std::vector<uint8_t> random_bytes(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = (uint8_t)g();
  return v;
}

class Queues : public ::testing::TestWithParam<io::Backend> {};

// Writes `data` in `chunk`-byte pieces (out of order) through a WriteQueue.
void write_all(const std::string& path, const std::vector<uint8_t>& data, size_t chunk, io::Backend b) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  std::atomic<size_t> done{0};
  size_t n_req = 0;
  {
    io::WriteQueue q(fd, b, 2, 4);
    if (b == io::Backend::kPosix) EXPECT_EQ(q.backend(), io::Backend::kPosix);
    else EXPECT_TRUE(q.backend() == io::Backend::kUring || q.backend() == io::Backend::kPosix);
    const size_t n_chunks = (data.size() + chunk - 1) / chunk;
    for (size_t k = 0; k < n_chunks; ++k) {  // odd chunks first, then even ones
      const size_t i = k < n_chunks / 2 ? 2 * k + 1 : 2 * (k - n_chunks / 2);
      if (i >= n_chunks) continue;
      const size_t off = i * chunk, n = std::min(chunk, data.size() - off);
      q.submit(off, data.data() + off, n, [&done] { done.fetch_add(1); });
      ++n_req;
    }
    EXPECT_EQ(q.drain(), 0);
    EXPECT_EQ(q.error(), 0);
  }
  EXPECT_EQ(done.load(), n_req);
  ::close(fd);
}

TEST_P(Queues, WriteThenReadBack) {
  TempFile f;
  const auto data = random_bytes(3 * 65536 + 123, 1);
  write_all(f.path, data, 4096 + 7, GetParam());

  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> back(data.size(), 0);
  std::mutex mu;
  std::vector<std::pair<int, size_t>> results;  // (err, got) per request, by index
  const size_t chunk = 10000;
  const size_t n_chunks = (data.size() + chunk - 1) / chunk;
  results.assign(n_chunks + 2, {-1, 0});
  std::vector<uint8_t> tail(chunk), past(chunk);
  {
    io::ReadQueue q(GetParam(), 2, 3);
    RecordProperty("read_backend", io::backend_name(q.backend()));
    std::printf("read back end: %s\n", io::backend_name(q.backend()));
    for (size_t i = 0; i < n_chunks; ++i) {
      const size_t off = i * chunk, n = std::min(chunk, data.size() - off);
      q.submit(fd, off, back.data() + off, n, [&, i](int err, size_t got) {
        std::lock_guard<std::mutex> lk(mu);
        results[i] = {err, got};
      });
    }
    // Straddling the end of file: only the bytes that exist.
    q.submit(fd, data.size() - 100, tail.data(), chunk, [&](int err, size_t got) {
      std::lock_guard<std::mutex> lk(mu);
      results[n_chunks] = {err, got};
    });
    // Past the end of file: nothing, and no error.
    q.submit(fd, data.size() + 5000, past.data(), chunk, [&](int err, size_t got) {
      std::lock_guard<std::mutex> lk(mu);
      results[n_chunks + 1] = {err, got};
    });
    q.drain();
  }
  ::close(fd);
  for (size_t i = 0; i < n_chunks; ++i) {
    EXPECT_EQ(results[i].first, 0) << i;
    EXPECT_EQ(results[i].second, std::min(chunk, data.size() - i * chunk)) << i;
  }
  EXPECT_TRUE(back == data);
  EXPECT_EQ(results[n_chunks].first, 0);
  EXPECT_EQ(results[n_chunks].second, 100u);
  EXPECT_EQ(0, std::memcmp(tail.data(), data.data() + data.size() - 100, 100));
  EXPECT_EQ(results[n_chunks + 1].first, 0);
  EXPECT_EQ(results[n_chunks + 1].second, 0u);
}

// A read on a descriptor that cannot be read fails with EBADF for that
// request only; the reads around it succeed.
TEST_P(Queues, ReadErrorGoesToItsRequest) {
  TempFile f;
  const auto data = random_bytes(50000, 2);
  write_all(f.path, data, 8192, io::Backend::kPosix);
  const int good = ::open(f.path.c_str(), O_RDONLY);
  const int bad = ::open(f.path.c_str(), O_WRONLY);
  ASSERT_GE(good, 0);
  ASSERT_GE(bad, 0);
  std::vector<std::vector<uint8_t>> bufs(9, std::vector<uint8_t>(5000));
  std::vector<std::pair<int, size_t>> res(bufs.size(), {-1, 0});
  std::mutex mu;
  {
    io::ReadQueue q(GetParam(), 2, 4);
    for (size_t i = 0; i < bufs.size(); ++i) {
      q.submit(i % 3 == 1 ? bad : good, i * 5000, bufs[i].data(), 5000, [&, i](int err, size_t got) {
        std::lock_guard<std::mutex> lk(mu);
        res[i] = {err, got};
      });
    }
    q.drain();
  }
  for (size_t i = 0; i < bufs.size(); ++i) {
    if (i % 3 == 1) {
      EXPECT_EQ(res[i].first, EBADF) << i;
      EXPECT_EQ(res[i].second, 0u) << i;
    } else {
      EXPECT_EQ(res[i].first, 0) << i;
      EXPECT_EQ(res[i].second, 5000u) << i;
      EXPECT_EQ(0, std::memcmp(bufs[i].data(), data.data() + i * 5000, 5000)) << i;
    }
  }
  ::close(good);
  ::close(bad);
}

// Writes to a descriptor open for reading fail: drain() and error() report
// the errno, every completion still runs, and later submits do not touch
// the file.
TEST_P(Queues, WriteErrorIsReportedAndLaterWritesSkipped) {
  TempFile f;
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const auto data = random_bytes(4096, 3);
  std::atomic<int> done{0};
  {
    io::WriteQueue q(fd, GetParam(), 2, 2);
    q.submit(0, data.data(), data.size(), [&] { done.fetch_add(1); });
    EXPECT_EQ(q.drain(), EBADF);
    EXPECT_EQ(q.error(), EBADF);
    for (int i = 0; i < 5; ++i) q.submit(4096u * (unsigned)i, data.data(), data.size(), [&] { done.fetch_add(1); });
    EXPECT_EQ(q.drain(), EBADF);
  }
  EXPECT_EQ(done.load(), 6);
  ::close(fd);
  struct stat st {};
  ASSERT_EQ(::stat(f.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
}

// Destroying queues right after submitting (no drain): every completion has
// run when the destructor returns, and the data is on disk.
TEST_P(Queues, DestroyWithRequestsInFlight) {
  TempFile f;
  const auto data = random_bytes(1 << 20, 4);
  const int wfd = ::open(f.path.c_str(), O_WRONLY);
  ASSERT_GE(wfd, 0);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> done{0};
    {
      io::WriteQueue q(wfd, GetParam(), 2, 8);
      for (int i = 0; i < 16; ++i)
        q.submit((uint64_t)i * 65536, data.data() + i * 65536, 65536, [&] { done.fetch_add(1); });
    }
    EXPECT_EQ(done.load(), 16);
  }
  ::close(wfd);
  const int rfd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(rfd, 0);
  std::vector<uint8_t> back(data.size());
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> done{0};
    std::atomic<size_t> bytes{0};
    std::fill(back.begin(), back.end(), 0);
    {
      io::ReadQueue q(GetParam(), 2, 8);
      for (int i = 0; i < 16; ++i)
        q.submit(rfd, (uint64_t)i * 65536, back.data() + i * 65536, 65536, [&](int err, size_t got) {
          if (err == 0) bytes.fetch_add(got);
          done.fetch_add(1);
        });
    }
    EXPECT_EQ(done.load(), 16);
    EXPECT_EQ(bytes.load(), data.size());
    EXPECT_TRUE(back == data);
  }
  ::close(rfd);
}

// An idle queue (nothing ever submitted) shuts down.
TEST_P(Queues, IdleShutdown) {
  for (int i = 0; i < 50; ++i) {
    io::ReadQueue r(GetParam(), 1, 1);
    io::WriteQueue w(1, GetParam(), 1, 1);
    EXPECT_EQ(w.drain(), 0);
  }
}


// ---- io_uring faults: a refused submission or a failing wait ends in an
// error of the requests concerned, never in a drain() that waits forever.
namespace fault = tz::io::testing;

// Fails the test (and ends the process) if the scope takes longer than
// `seconds`: a hang here is the bug under test.
struct Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread th;
  explicit Watchdog(const char* what, int seconds = 30)
      : th([this, what, seconds] {
          std::unique_lock<std::mutex> lk(mu);
          if (!cv.wait_for(lk, std::chrono::seconds(seconds), [&] { return done; })) {
            std::fprintf(stderr, "hang: %s did not finish in %d s\n", what, seconds);
            std::_Exit(3);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu);
      done = true;
    }
    cv.notify_all();
    th.join();
  }
};

struct FaultGuard {
  ~FaultGuard() { fault::clear_uring_faults(); }
};

bool uring_available() {
  io::ReadQueue q(io::Backend::kUring, 1, 1);
  return q.backend() == io::Backend::kUring;
}

// Every write submission refused (ENOMEM) after two went through: those two
// land, the rest fail, drain() returns the errno, every completion ran.
TEST(UringFaults, RefusedSubmissionFailsTheWrite) {
  if (!uring_available()) GTEST_SKIP() << "io_uring not available here";
  FaultGuard g;
  TempFile f;
  const int fd = ::open(f.path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const auto data = random_bytes(6 * 4096, 5);
  std::atomic<int> done{0};
  {
    Watchdog w("WriteQueue with refused submissions");
    io::WriteQueue q(fd, io::Backend::kUring, 1, 4);
    ASSERT_EQ(q.backend(), io::Backend::kUring);
    fault::inject_uring_fault(fault::UringFault::kSubmit, ENOMEM, 2);
    for (int i = 0; i < 6; ++i) q.submit(4096u * (unsigned)i, data.data() + 4096 * i, 4096, [&] { done.fetch_add(1); });
    EXPECT_EQ(q.drain(), ENOMEM);
    EXPECT_EQ(q.error(), ENOMEM);
  }
  EXPECT_EQ(done.load(), 6);
  ::close(fd);
  const auto back = [&] {
    std::vector<uint8_t> b(2 * 4096);
    const int rfd = ::open(f.path.c_str(), O_RDONLY);
    EXPECT_EQ(::pread(rfd, b.data(), b.size(), 0), (ssize_t)b.size());
    ::close(rfd);
    return b;
  }();
  EXPECT_EQ(0, std::memcmp(back.data(), data.data(), back.size()));
}

// Reads: a refused submission fails that read with the errno, and the ring
// stays refused (later reads fail at once); reads before it succeed.
TEST(UringFaults, RefusedSubmissionFailsTheRead) {
  if (!uring_available()) GTEST_SKIP() << "io_uring not available here";
  FaultGuard g;
  TempFile f;
  const auto data = random_bytes(8 * 4096, 6);
  write_all(f.path, data, 4096, io::Backend::kPosix);
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> back(data.size());
  std::vector<int> err(8, -1);
  std::mutex mu;
  {
    Watchdog w("ReadQueue with refused submissions");
    io::ReadQueue q(io::Backend::kUring, 1, 4);
    fault::inject_uring_fault(fault::UringFault::kSubmit, EBADF, 3, 1);  // one hard refusal
    for (int i = 0; i < 8; ++i)
      q.submit(fd, 4096u * (unsigned)i, back.data() + 4096 * i, 4096, [&, i](int e, size_t) {
        std::lock_guard<std::mutex> lk(mu);
        err[(size_t)i] = e;
      });
    q.drain();
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(err[(size_t)i], 0) << i;
    EXPECT_EQ(0, std::memcmp(back.data() + 4096 * i, data.data() + 4096 * i, 4096)) << i;
  }
  for (int i = 3; i < 8; ++i) EXPECT_EQ(err[(size_t)i], EBADF) << i;
  ::close(fd);
}

// Transient refusals (EAGAIN) are retried: every read succeeds.
TEST(UringFaults, TransientRefusalsAreRetried) {
  if (!uring_available()) GTEST_SKIP() << "io_uring not available here";
  FaultGuard g;
  TempFile f;
  const auto data = random_bytes(4 * 4096, 7);
  write_all(f.path, data, 4096, io::Backend::kPosix);
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> back(data.size());
  std::atomic<int> ok{0};
  {
    io::ReadQueue q(io::Backend::kUring, 1, 4);
    fault::inject_uring_fault(fault::UringFault::kSubmit, EAGAIN, 1, 5);
    for (int i = 0; i < 4; ++i)
      q.submit(fd, 4096u * (unsigned)i, back.data() + 4096 * i, 4096, [&](int e, size_t got) {
        if (e == 0 && got == 4096) ok.fetch_add(1);
      });
    q.drain();
  }
  EXPECT_EQ(ok.load(), 4);
  EXPECT_TRUE(back == data);
  ::close(fd);
}

// The wait for completions fails (the reaper cannot learn what happened):
// every request in flight fails with that errno, drain() and the
// destructors return, later requests fail at once. The reaper's first wait
// works (one completion), every later one fails.
TEST(UringFaults, FailingWaitFailsTheRequestsInFlight) {
  if (!uring_available()) GTEST_SKIP() << "io_uring not available here";
  FaultGuard g;
  TempFile f;
  const auto data = random_bytes(4 * 4096, 8);
  write_all(f.path, data, 4096, io::Backend::kPosix);
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> back(data.size());
  std::atomic<int> failed{0}, ok{0};
  {
    Watchdog w("ReadQueue with a failing wait");
    fault::inject_uring_fault(fault::UringFault::kWait, EFAULT, 1);
    io::ReadQueue q(io::Backend::kUring, 1, 4);
    for (int i = 0; i < 4; ++i)
      q.submit(fd, 4096u * (unsigned)i, back.data() + 4096 * i, 4096, [&](int e, size_t got) {
        if (e == EFAULT) failed.fetch_add(1);
        else if (e == 0 && got == 4096) ok.fetch_add(1);
      });
    q.drain();
  }
  EXPECT_EQ(ok.load(), 1);
  EXPECT_EQ(failed.load(), 3);
  ::close(fd);
  std::atomic<int> wdone{0};
  {
    Watchdog w("WriteQueue with a failing wait");
    fault::inject_uring_fault(fault::UringFault::kWait, EIO);
    TempFile g2;
    const int wfd = ::open(g2.path.c_str(), O_WRONLY);
    io::WriteQueue q(wfd, io::Backend::kUring, 1, 4);
    for (int i = 0; i < 4; ++i) q.submit(4096u * (unsigned)i, data.data() + 4096 * i, 4096, [&] { wdone.fetch_add(1); });
    EXPECT_EQ(q.drain(), EIO);
    ::close(wfd);
  }
  EXPECT_EQ(wdone.load(), 4);
}

INSTANTIATE_TEST_SUITE_P(Backends, Queues, ::testing::Values(io::Backend::kPosix, io::Backend::kUring),
                         [](const auto& info) { return std::string(io::backend_name(info.param)) == "io_uring"
                                                           ? std::string("uring")
                                                           : std::string(io::backend_name(info.param)); });

}  // namespace

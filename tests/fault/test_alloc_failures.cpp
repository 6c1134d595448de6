// Allocation failure never ends the process: the C ABI returns an error code
// (TZ_ERROR_ALLOCATION, TZIP_ERROR_*), the C++ APIs throw. This binary
// replaces the global operator new with one that fails the N-th allocation
// of at least kMinBytes after it is armed (any thread), and sweeps N over
// the allocations of a compress, a decompress, a .tzip compress/read and a
// checkpoint save/restore: each run must end in success or in the error,
// never in std::terminate (which used to happen when the failure hit a
// worker of the codec's thread pool). A thread that cannot start (a tiny
// RLIMIT_AS in a child process) is likewise an error code.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "tensorzip/checkpoint.hpp"
#include "tensorzip/tensorzip.h"
#include "tensorzip/tzip_file.h"

namespace fs = std::filesystem;

// ---- the allocation-failure hook ------------------------------------------
namespace {
constexpr size_t kMinBytes = 1024;     // small allocations (std::function, strings) are left alone
std::atomic<long> g_countdown{-1};     // armed while >= 0: the allocation that takes it to -1 fails
std::atomic<int> g_failed{0};          // failures injected
std::atomic<int> g_failed_off_main{0}; // ... of them on another thread than the test's
std::thread::id g_main_thread;

// True when this allocation is the one to fail.
bool inject_failure(size_t n) {
  if (n < kMinBytes || g_countdown.load(std::memory_order_relaxed) < 0 || g_countdown.fetch_sub(1) != 0) return false;
  g_failed.fetch_add(1);
  if (std::this_thread::get_id() != g_main_thread) g_failed_off_main.fetch_add(1);
  return true;
}

void* hooked_alloc(size_t n) {
  if (inject_failure(n)) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}

void* hooked_aligned_alloc(size_t n, std::align_val_t a) {
  if (inject_failure(n)) throw std::bad_alloc();
  void* p = nullptr;
  if (::posix_memalign(&p, std::max<size_t>((size_t)a, sizeof(void*)), n ? n : 1) != 0) throw std::bad_alloc();
  return p;
}

// Arms the hook for the scope: the nth (0-based) allocation >= kMinBytes fails.
struct FailNth {
  explicit FailNth(long nth) { g_countdown.store(nth); }
  ~FailNth() { g_countdown.store(-1); }
  bool fired() const { return g_countdown.load() < 0; }
};
}  // namespace

// Every replaceable form, so that what one form allocates another frees
// consistently (malloc/free underneath).
void* operator new(size_t n) { return hooked_alloc(n); }
void* operator new[](size_t n) { return hooked_alloc(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return hooked_alloc(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(size_t n, std::align_val_t a) { return hooked_aligned_alloc(n, a); }
void* operator new[](size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

class AllocFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    g_main_thread = std::this_thread::get_id();
    g_failed = 0;
    g_failed_off_main = 0;
  }
};

std::vector<uint8_t> bf16_like(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i + 1 < n; i += 2) {
    const float f = nd(g);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v[i] = (uint8_t)(u >> 16);
    v[i + 1] = (uint8_t)(u >> 24);
  }
  return v;
}

std::string temp_dir() {
  std::string t = "/tmp/tz_alloc_XXXXXX";
  std::vector<char> b(t.begin(), t.end());
  b.push_back(0);
  return ::mkdtemp(b.data()) ? std::string(b.data()) : std::string();
}

}  // namespace

// The pool itself: an exception in a worker's task reaches the caller of
// parallel_for; the pool stays usable.
TEST_F(AllocFailure, PoolTaskExceptionReachesTheCaller) {
  tz::cpu::ThreadPool pool(4);
  std::atomic<int> ran{0};
  bool thrown = false;
  try {
    pool.parallel_for(2000, [&](size_t, unsigned w) {
      ran.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (w != 0) throw std::bad_alloc();  // only on pool threads
    });
  } catch (const std::bad_alloc&) {
    thrown = true;
  }
  EXPECT_TRUE(thrown);
  EXPECT_LT(ran.load(), 2000);  // the rest was not started
  std::atomic<size_t> sum{0};
  pool.parallel_for(100, [&](size_t t, unsigned) { sum.fetch_add(t); });
  EXPECT_EQ(sum.load(), 4950u);
}

// The codec's C API with a 4-thread context: every failing allocation gives
// TZ_ERROR_ALLOCATION (or the call succeeds, if it was not needed).
TEST_F(AllocFailure, CodecReturnsAllocationError) {
  const auto src = bf16_like(8u << 20, 1);
  std::vector<uint8_t> comp(tz_compress_bound(src.size())), back(src.size());
  tz_params p{};
  p.dtype = TZ_DTYPE_BF16;
  p.level = 2;
  size_t csize = 0;
  int errors = 0, sweeps = 0;
  for (long nth = 0; nth < 64; ++nth, ++sweeps) {
    tz_ctx* ctx = tz_ctx_create(4);
    ASSERT_NE(ctx, nullptr);
    size_t r;
    bool fired;
    {
      FailNth f(nth);
      r = tz_ctx_compress(ctx, comp.data(), comp.size(), src.data(), src.size(), &p);
      fired = f.fired();
    }
    if (tz_is_error(r)) {
      EXPECT_EQ(tz_get_error_code(r), TZ_ERROR_ALLOCATION) << nth << ": " << tz_get_error_name(r);
      EXPECT_TRUE(fired) << nth;
      ++errors;
    } else {
      csize = r;
    }
    tz_ctx_free(ctx);
    if (!fired) break;  // nth past the last allocation: every point was tried
  }
  ASSERT_GT(csize, 0u);
  for (long nth = 0; nth < 64; ++nth) {
    tz_ctx* ctx = tz_ctx_create(4);
    ASSERT_NE(ctx, nullptr);
    size_t r;
    bool fired;
    {
      FailNth f(nth);
      r = tz_ctx_decompress(ctx, back.data(), back.size(), comp.data(), csize);
      fired = f.fired();
    }
    if (tz_is_error(r)) {
      EXPECT_EQ(tz_get_error_code(r), TZ_ERROR_ALLOCATION) << nth << ": " << tz_get_error_name(r);
      ++errors;
    } else {
      EXPECT_EQ(r, src.size());
      EXPECT_TRUE(back == src) << nth;
    }
    tz_ctx_free(ctx);
    if (!fired) break;
  }
  std::printf("codec: %d allocation points failed over %d compress runs, %d of them on pool threads\n", errors, sweeps,
              g_failed_off_main.load());
  EXPECT_GT(errors, 0);
  EXPECT_GT(g_failed_off_main.load(), 0) << "no failure reached a pool thread: the sweep does not test the pool";
}

// The container's C API: an error code and message, no output, no temporary.
TEST_F(AllocFailure, ContainerCApiReturnsAnError) {
  const std::string dir = temp_dir();
  ASSERT_FALSE(dir.empty());
  const std::string in = std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-fp32.safetensors";
  const std::string out = dir + "/x.tzip";
  int errors = 0;
  for (long nth = 0; nth < 400; nth += (nth < 40 ? 1 : 7)) {
    int rc;
    bool fired;
    {
      FailNth f(nth);
      rc = tzip_compress_file(in.c_str(), out.c_str(), 1, 2, 1);
      fired = f.fired();
    }
    if (rc != TZIP_OK) {
      ++errors;
      EXPECT_TRUE(fired) << nth;
      EXPECT_NE(std::string(tzip_last_error()), "") << nth;
      EXPECT_FALSE(fs::exists(out)) << nth << ": " << tzip_last_error();
      for (const auto& e : fs::directory_iterator(dir)) ADD_FAILURE() << nth << ": left behind " << e.path();
    } else {
      fs::remove(out);
    }
    if (!fired) break;
  }
  ASSERT_EQ(tzip_compress_file(in.c_str(), out.c_str(), 1, 2, 1), TZIP_OK) << tzip_last_error();
  for (long nth = 0; nth < 400; nth += (nth < 40 ? 1 : 7)) {
    int rc = TZIP_OK;
    bool fired;
    {
      FailNth f(nth);
      tzip_reader* r = tzip_open(out.c_str(), 2);
      if (!r) {
        rc = -1;
      } else {
        for (size_t i = 0; i < tzip_tensor_count(r) && rc == TZIP_OK; ++i) {
          std::vector<uint8_t> b;
          try {
            b.resize(tzip_tensor_size(r, i));
          } catch (const std::bad_alloc&) {  // the test's own buffer
            break;
          }
          rc = tzip_read_tensor(r, i, b.data(), b.size());
        }
        tzip_close(r);
      }
      fired = f.fired();
    }
    if (rc != TZIP_OK) ++errors;
    if (!fired) break;
  }
  EXPECT_GT(errors, 0);
  fs::remove_all(dir);
}

// The checkpoint engine: save and restore throw tz::checkpoint::Error
// (nothing else), a failed save leaves no manifest, a restore either
// succeeds with the right bytes or throws.
TEST_F(AllocFailure, CheckpointSaveAndRestoreThrowErrors) {
  namespace ck = tz::checkpoint;
  const std::string root = temp_dir();
  ASSERT_FALSE(root.empty());
  const auto a = bf16_like(3u << 20, 2), b = bf16_like(1u << 20, 3);
  const std::vector<ck::TensorView> v = {{"a", "BF16", {a.size() / 2}, a.data(), a.size()},
                                         {"b", "BF16", {b.size() / 2}, b.data(), b.size()}};
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  o.threads = 2;
  o.chunk_bytes = 1u << 20;
  int errors = 0, k = 0;
  for (long nth = 0; nth < 2000; nth += (nth < 60 ? 1 : 23), ++k) {
    const std::string dir = root + "/s" + std::to_string(k);
    bool fired;
    try {
      FailNth f(nth);
      ck::save(dir, v, o);
      fired = f.fired();
    } catch (const ck::Error& e) {
      fired = true;
      ++errors;
      EXPECT_FALSE(ck::is_complete(dir)) << nth << ": " << e.what();
    }
    if (!fired) break;
  }
  const std::string good = root + "/good";
  ck::save(good, v, o);
  for (long nth = 0; nth < 2000; nth += (nth < 60 ? 1 : 23)) {
    std::vector<uint8_t> x(a.size()), y(b.size());
    bool fired;
    try {
      FailNth f(nth);
      ck::Checkpoint c(good, 2);
      const ck::LoadRequest req[] = {{"a", x.data(), x.size()}, {"b", y.data(), y.size()}};
      c.load(req);
      fired = f.fired();
      EXPECT_TRUE(x == a && y == b) << nth;
    } catch (const ck::Error& e) {
      fired = true;
      ++errors;
    }
    if (!fired) break;
  }
  EXPECT_GT(errors, 0);
  fs::remove_all(root);
}

// A thread that cannot start (address space limit in a child process) is
// an error code, not std::terminate.
TEST_F(AllocFailure, ThreadThatCannotStartIsAnErrorCode) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "RLIMIT_AS and sanitizer shadow memory do not mix";
#else
  const auto src = bf16_like(4u << 20, 4);
  std::vector<uint8_t> comp(tz_compress_bound(src.size()));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    if (pages == 0) _exit(10);
    const rlim_t lim = (rlim_t)pages * (rlim_t)::sysconf(_SC_PAGESIZE) + (rlim_t)(24u << 20);
    rlimit rl{lim, lim};
    if (::setrlimit(RLIMIT_AS, &rl) != 0) _exit(11);
    tz_params p{};
    p.dtype = TZ_DTYPE_BF16;
    p.threads = 64;  // 64 thread stacks cannot fit in 24 MiB
    const size_t r = tz_compress(comp.data(), comp.size(), src.data(), src.size(), &p);
    if (!tz_is_error(r)) _exit(12);  // the limit did not bite: inconclusive
    _exit(tz_get_error_code(r) == TZ_ERROR_ALLOCATION ? 0 : 20 + (int)tz_get_error_code(r));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  if (WEXITSTATUS(status) == 12) GTEST_SKIP() << "the address space limit did not stop any thread here";
  EXPECT_EQ(WEXITSTATUS(status), 0);
#endif
}

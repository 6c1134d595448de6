// Buffer reuse of the container's passes (src/container/pipeline.hpp,
// file_io.hpp): the pool that hands each pipeline item the most recently
// freed set of buffers, the grow-once byte buffer, and OutFile's mix of
// buffered and direct writes. The passes built on them (export, verify,
// compress_file, TensorWriter, read_tensors) are checked byte for byte at
// every thread count in test_container.cpp and test_tensor_writer.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "container/file_io.hpp"
#include "container/pipeline.hpp"
#include "tensorzip/container.hpp"

namespace tc = tz::container;
namespace td = tz::container::detail;

namespace {

struct Set {
  td::Buf buf;
  std::atomic<int> users{0};  // items holding this set right now
  size_t item = 0;
};

TEST(ReusePool, HandsOutTheMostRecentlyReturnedSetFirst) {
  td::ReusePool<Set> pool(3);
  Set* a = pool.take();
  Set* b = pool.take();
  EXPECT_NE(a, b);
  EXPECT_EQ(pool.made(), 2u);
  pool.give(a);
  pool.give(b);
  EXPECT_EQ(pool.take(), b);  // last in, first out: the warmest set
  EXPECT_EQ(pool.take(), a);
  EXPECT_EQ(pool.made(), 2u);  // nothing new was made
  Set* c = pool.take();
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(pool.made(), 3u);
}

TEST(ReusePool, RefusesMoreSetsThanItHolds) {
  td::ReusePool<Set> pool(2);
  pool.take();
  pool.take();
  try {
    pool.take();
    ADD_FAILURE() << "a third set was handed out by a pool of two";
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kInternal);
  }
}

// Runs n items through run_pipeline: produce writes the item number into
// its set's buffer (grown to `size(i)` bytes), work checks and transforms
// it, consume checks it arrived in order with its own bytes. Returns the
// number of distinct sets the pool made.
size_t run_items(size_t n, size_t window, unsigned threads, const std::function<size_t(size_t)>& size,
                 std::atomic<int>* overlaps) {
  td::ReusePool<Set> pool(window);
  size_t max_size = 0;
  for (size_t i = 0; i < n; ++i) max_size = std::max(max_size, size(i));
  size_t next = 0;
  td::run_pipeline(
      n, window, pool, threads,
      [&](size_t i, Set& s) {
        if (s.users.fetch_add(1) != 0) ++*overlaps;  // a set held by two items at once
        s.item = i;
        uint8_t* p = s.buf.reserve(size(i), max_size);
        for (size_t k = 0; k < size(i); ++k) p[k] = (uint8_t)(i + k);
      },
      [&](size_t i, Set& s, unsigned) {
        EXPECT_EQ(s.item, i);
        for (size_t k = 0; k < s.buf.size; ++k) s.buf.p[k] ^= 0x5a;
      },
      [&](size_t i, Set& s) {
        EXPECT_EQ(i, next++);
        EXPECT_EQ(s.item, i);
        ASSERT_EQ(s.buf.size, size(i));
        bool same = true;
        for (size_t k = 0; k < size(i); ++k) same &= s.buf.p[k] == (uint8_t)((uint8_t)(i + k) ^ 0x5a);
        EXPECT_TRUE(same) << "item " << i;
        s.users.fetch_sub(1);
      });
  EXPECT_EQ(next, n);
  return pool.made();
}

// One thread runs each item's stages one after the other: every item uses
// the same warm set of buffers, whatever the window (OrderedPipeline's slot
// ring alone would cycle through all of them).
TEST(RunPipeline, OneThreadReusesOneSetOfBuffers) {
  std::atomic<int> overlaps{0};
  for (size_t window : {1u, 4u, 7u})
    EXPECT_EQ(run_items(60, window, 1, [](size_t i) { return 100 + (i * 37) % 5000; }, &overlaps), 1u) << window;
  EXPECT_EQ(overlaps.load(), 0);
}

// Several threads: never more sets than the window, none shared by two
// items at once, items consumed in order with their own bytes, for items
// whose sizes vary (the largest neither first nor last).
TEST(RunPipeline, ThreadsStayWithinTheWindowAndNeverShareASet) {
  std::atomic<int> overlaps{0};
  for (unsigned threads : {2u, 3u, 5u})
    for (size_t window : {2u, 3u, 6u}) {
      const size_t made = run_items(
          200, window, threads, [](size_t i) { return i == 120 ? 300000 : 1 + (i * 7919) % 20000; }, &overlaps);
      EXPECT_GE(made, 1u);
      EXPECT_LE(made, window) << threads << " threads, window " << window;
    }
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(Buf, GrowsOnceToTheLargestSizeAsked) {
  td::Buf b;
  uint8_t* p = b.reserve(10, 5000);
  EXPECT_EQ(b.cap, 5000u);
  EXPECT_EQ(b.size, 10u);
  EXPECT_EQ(b.reserve(4999, 5000), p);  // no new allocation up to the hint
  EXPECT_EQ(b.reserve(5000), p);
  EXPECT_EQ(b.size, 5000u);
  b.reserve(7000, 100);  // a request over the capacity always gets its bytes
  EXPECT_GE(b.cap, 7000u);
  EXPECT_EQ(b.size, 7000u);
}

// With huge pages (the whole-file passes' buffers), buffers of
// kHugeBufferMin bytes or more are whole 2 MiB, aligned to 2 MiB (so that
// the transparent huge pages they are offered can back them); smaller ones
// are exactly the size asked, as are all without huge pages. Every byte of
// the capacity is usable.
TEST(Buf, LargeBuffersAreWholeAlignedHugePages) {
  for (size_t n : {td::kHugeBufferMin - 1, td::kHugeBufferMin, td::kHugePage, td::kHugePage + 1, (size_t)(4u << 20),
                   (size_t)(9u << 20) + 17}) {
    td::Buf plain;
    plain.reserve(n);
    EXPECT_EQ(plain.cap, n);
    td::Buf b(true);
    uint8_t* p = b.reserve(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(b.size, n);
    if (n < td::kHugeBufferMin) {
      EXPECT_EQ(b.cap, n);
    } else {
      EXPECT_EQ(b.cap % td::kHugePage, 0u) << n;
      EXPECT_GE(b.cap, n);
      EXPECT_LT(b.cap - n, td::kHugePage) << n;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % td::kHugePage, 0u) << n;
    }
    std::memset(p, 0xA5, b.cap);  // the whole capacity is ours
    EXPECT_EQ(p[0], 0xA5);
    EXPECT_EQ(p[b.cap - 1], 0xA5);
    // Within the capacity no new allocation; beyond it a new (large) one.
    EXPECT_EQ(b.reserve(b.cap), p);
    uint8_t* q = b.reserve(b.cap + 1);
    EXPECT_GE(b.cap, b.size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % td::kHugePage, 0u);
  }
}

// OutFile gathers small writes and passes large ones straight to the file:
// any mix of sizes (around the buffer's size and the direct-write threshold)
// gives exactly the bytes written, in order.
TEST(OutFile, AnyMixOfWriteSizesGivesTheBytesInOrder) {
  const std::string dir = std::filesystem::temp_directory_path() / ("tz_outfile_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::mt19937 rng(5);
  const std::vector<size_t> sizes = {1, 0, 100, (128u << 10) - 1, 128u << 10, (128u << 10) + 1, 7, (1u << 20) - 5,
                                     (1u << 20), (1u << 20) + 3, 3, (5u << 20) + 11, 64, 900000, 200000, 1};
  for (int order = 0; order < 3; ++order) {
    std::vector<size_t> v = sizes;
    if (order) std::shuffle(v.begin(), v.end(), rng);
    std::vector<uint8_t> want;
    const std::string path = dir + "/out" + std::to_string(order);
    {
      td::OutFile f(path, false);
      for (size_t n : v) {
        std::vector<uint8_t> chunk(n);
        for (auto& c : chunk) c = (uint8_t)rng();
        f.write(chunk.data(), n);
        want.insert(want.end(), chunk.begin(), chunk.end());
        EXPECT_EQ(f.offset(), want.size());
      }
      f.commit();
    }
    std::ifstream in(path, std::ios::binary);
    const std::vector<uint8_t> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(got == want) << "order " << order << ": " << got.size() << " bytes, want " << want.size();
  }
  std::filesystem::remove_all(dir);
}

// Positional writes (the export pass's parallel writers): buffered bytes,
// then ranges written by three threads in a shuffled order (20 MiB, so the
// early writeback of whole chunks runs too), then buffered bytes again: the
// file holds every byte at its place and offset() counts them all. A
// stream (a character device) takes no positional writes.
TEST(OutFile, PositionalWritesFromThreadsLandAtTheirOffsets) {
  const std::string dir = std::filesystem::temp_directory_path() / ("tz_outfile_at_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::mt19937 rng(9);
  std::vector<uint8_t> want(100 + (20u << 20) + 77);
  for (auto& c : want) c = (uint8_t)rng();
  const std::string path = dir + "/out";
  {
    td::OutFile f(path, false);
    ASSERT_TRUE(f.positional());
    f.write(want.data(), 100);
    f.flush();
    std::vector<std::pair<uint64_t, size_t>> ranges;
    for (uint64_t off = 100; off < 100 + (20u << 20);) {
      const size_t n = std::min<uint64_t>(1 + rng() % (3u << 20), 100 + (20u << 20) - off);
      ranges.emplace_back(off, n);
      off += n;
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);
    std::atomic<size_t> next{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; ++t)
      ts.emplace_back([&] {
        for (size_t i; (i = next++) < ranges.size();) f.write_at(want.data() + ranges[i].first, ranges[i].second, ranges[i].first);
      });
    for (auto& t : ts) t.join();
    f.end_positional();
    EXPECT_EQ(f.offset(), 100u + (20u << 20));
    f.write(want.data() + 100 + (20u << 20), 77);
    EXPECT_EQ(f.offset(), want.size());
    f.commit();
  }
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(got == want) << got.size() << " bytes, want " << want.size();
  td::OutFile null_out("/dev/null", false);
  EXPECT_FALSE(null_out.positional());
  std::filesystem::remove_all(dir);
}

}  // namespace

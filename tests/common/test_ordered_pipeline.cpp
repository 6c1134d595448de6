// The ordered, bounded pipeline (src/common/ordered_pipeline.h) under
// adversarial scheduling: random sleeps and yields in every stage, more
// threads than cores, completions from foreign threads in any order. Each
// test checks the contract, not timings: commit (and issue) in item order,
// never more than `window` items between issue and release, a slot never
// shared by two live items, every item worked exactly once, the first error
// rethrown and nothing started after it, and no completion arriving after
// run() returned.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/ordered_pipeline.h"
#include "common/thread_pool.h"

using tz::cpu::OrderedPipeline;
using tz::cpu::ThreadPool;

namespace {

// A short random pause: nothing, a yield, or a sleep of up to 200 us,
// drawn from the item so that runs differ between stages and items.
void jitter(size_t item, int stage) {
  thread_local std::mt19937 rng((unsigned)std::hash<std::thread::id>()(std::this_thread::get_id()));
  const unsigned r = (unsigned)(rng() ^ (item * 2654435761u) ^ (unsigned)stage * 40503u) % 10;
  if (r < 3) return;
  if (r < 6) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(r == 9 ? 200 : 20 * r));
}

// Checks the slot and window rules from inside the stages.
struct Monitor {
  explicit Monitor(size_t n, size_t window) : window(window), slot_owner(window), worked(n) {
    for (auto& o : slot_owner) o = -1;
    for (auto& w : worked) w = 0;
  }
  size_t window;
  std::vector<std::atomic<long>> slot_owner;  // item holding the slot, -1 when free
  std::vector<std::atomic<int>> worked;
  std::atomic<long> in_flight{0}, max_in_flight{0};
  std::atomic<int> violations{0};
  std::mutex mu;
  std::vector<size_t> issued, committed;

  void on_issue(size_t i, size_t slot) {
    if (slot != i % window) ++violations;
    long expect = -1;
    if (!slot_owner[slot].compare_exchange_strong(expect, (long)i)) ++violations;  // slot still in use
    const long f = ++in_flight;
    for (long m = max_in_flight.load(); f > m && !max_in_flight.compare_exchange_weak(m, f);) {
    }
    std::lock_guard<std::mutex> lk(mu);
    issued.push_back(i);
  }
  void on_work(size_t i, size_t slot) {
    if (slot_owner[slot].load() != (long)i) ++violations;
    ++worked[i];
  }
  void on_commit(size_t i, size_t slot) {
    if (slot_owner[slot].load() != (long)i) ++violations;
    std::lock_guard<std::mutex> lk(mu);
    committed.push_back(i);
  }
  void on_release(size_t i, size_t slot) {
    --in_flight;
    long expect = (long)i;
    if (!slot_owner[slot].compare_exchange_strong(expect, -1)) ++violations;
  }
};

// Completions from a helper thread, in a shuffled order, after a delay.
class LateCaller {
 public:
  LateCaller() : t_([this] { loop(); }) {}
  ~LateCaller() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    t_.join();
  }
  void post(std::function<void()> f) {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(f));
    cv_.notify_all();
  }

 private:
  void loop() {
    std::mt19937 rng(7);
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        // Take a random one of the queued completions: out of order.
        const size_t k = rng() % q_.size();
        f = std::move(q_[k]);
        q_.erase(q_.begin() + (long)k);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 150));
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  std::thread t_;
};

std::vector<size_t> iota_n(size_t n) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

struct Shape {
  unsigned threads;
  size_t window;
  bool pool;
};

class OrderedPipelineOrder : public ::testing::TestWithParam<Shape> {};

TEST_P(OrderedPipelineOrder, CommitsInOrderWithinTheWindow) {
  const Shape sh = GetParam();
  const size_t n = 600;
  Monitor mon(n, sh.window);
  OrderedPipeline::Stages st;
  st.issue = [&](size_t i, size_t s) {
    jitter(i, 0);
    mon.on_issue(i, s);
  };
  st.work = [&](size_t i, size_t s, unsigned w) {
    if (w >= sh.threads) ++mon.violations;
    jitter(i, 1);
    mon.on_work(i, s);
  };
  st.commit = [&](size_t i, size_t s) {
    jitter(i, 2);
    mon.on_commit(i, s);
    mon.on_release(i, s);
  };
  OrderedPipeline p(n, sh.window, st);
  if (sh.pool) {
    ThreadPool pool(sh.threads);
    p.run(pool);
  } else {
    p.run(sh.threads);
  }
  EXPECT_EQ(mon.violations.load(), 0);
  EXPECT_EQ(mon.issued, iota_n(n));
  EXPECT_EQ(mon.committed, iota_n(n));
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(mon.worked[i].load(), 1) << "item " << i;
  EXPECT_LE(mon.max_in_flight.load(), (long)sh.window);
  EXPECT_EQ(mon.in_flight.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, OrderedPipelineOrder,
                         ::testing::Values(Shape{1, 1, false}, Shape{1, 4, false}, Shape{2, 1, false},
                                           Shape{2, 3, false}, Shape{8, 3, false}, Shape{8, 16, false},
                                           Shape{3, 5, true}, Shape{8, 10, true}));

// One thread runs the stages strictly one after the other: issue, work,
// commit of item 0, then of item 1, ...
TEST(OrderedPipeline, OneThreadIsSequential) {
  std::vector<std::pair<int, size_t>> trace;
  const std::thread::id me = std::this_thread::get_id();
  bool other_thread = false;
  OrderedPipeline::Stages st;
  st.issue = [&](size_t i, size_t) { trace.push_back({0, i}); };
  st.work = [&](size_t i, size_t, unsigned) {
    trace.push_back({1, i});
    other_thread |= std::this_thread::get_id() != me;
  };
  st.commit = [&](size_t i, size_t) { trace.push_back({2, i}); };
  OrderedPipeline p(5, 4, st);
  p.run(1u);
  std::vector<std::pair<int, size_t>> want;
  for (size_t i = 0; i < 5; ++i) want.push_back({0, i}), want.push_back({1, i}), want.push_back({2, i});
  EXPECT_EQ(trace, want);
  EXPECT_FALSE(other_thread);
}

// read_ahead 2 on one thread: item k+1 is issued before item k is worked
// on (the GPU restore's double buffering).
TEST(OrderedPipeline, OneThreadReadsAhead) {
  std::vector<std::pair<int, size_t>> trace;
  OrderedPipeline::Stages st;
  st.issue = [&](size_t i, size_t) { trace.push_back({0, i}); };
  st.work = [&](size_t i, size_t, unsigned) { trace.push_back({1, i}); };
  st.read_ahead = 2;
  OrderedPipeline p(5, 2, st);
  p.run(1u);
  const std::vector<std::pair<int, size_t>> want = {{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1},
                                                    {0, 3}, {1, 2}, {0, 4}, {1, 3}, {1, 4}};
  EXPECT_EQ(trace, want);
}

TEST(OrderedPipeline, NoItems) {
  bool called = false;
  OrderedPipeline::Stages st;
  st.work = [&](size_t, size_t, unsigned) { called = true; };
  OrderedPipeline p(0, 3, st);
  p.run(4u);
  EXPECT_FALSE(called);
}

// issue() starts work that completes later, on another thread, in any
// order; no work before its ready(); no commit stage (slots free after work).
TEST(OrderedPipeline, AsynchronousIssueCompletesOutOfOrder) {
  const size_t n = 400, window = 6;
  Monitor mon(n, window);
  std::vector<std::atomic<int>> arrived(n);
  for (auto& a : arrived) a = 0;
  std::atomic<int> early_work{0};
  {
    LateCaller late;
    OrderedPipeline* pp = nullptr;
    OrderedPipeline::Stages st;
    st.issue = [&](size_t i, size_t s) {
      mon.on_issue(i, s);
      if (i % 7 == 3) {  // some complete at once, inside issue()
        arrived[i] = 1;
        pp->ready(i);
        return;
      }
      late.post([&, i] {
        arrived[i] = 1;
        pp->ready(i);
      });
    };
    st.issue_completes_later = true;
    st.work = [&](size_t i, size_t s, unsigned) {
      if (!arrived[i].load()) ++early_work;
      jitter(i, 1);
      mon.on_work(i, s);
      mon.on_release(i, s);
    };
    OrderedPipeline p(n, window, st);
    pp = &p;
    p.run(4u);
  }
  EXPECT_EQ(early_work.load(), 0);
  EXPECT_EQ(mon.violations.load(), 0);
  EXPECT_EQ(mon.issued, iota_n(n));
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(mon.worked[i].load(), 1);
  EXPECT_LE(mon.max_in_flight.load(), (long)window);
}

// commit() hands the slot to an asynchronous write; the slot is reused only
// after release(), which comes from another thread in any order.
TEST(OrderedPipeline, CommitReleasesLater) {
  const size_t n = 400, window = 5;
  Monitor mon(n, window);
  std::atomic<long> outstanding{0};
  {
    LateCaller late;
    OrderedPipeline* pp = nullptr;
    OrderedPipeline::Stages st;
    st.issue = [&](size_t i, size_t s) { mon.on_issue(i, s); };
    st.work = [&](size_t i, size_t s, unsigned) {
      jitter(i, 1);
      mon.on_work(i, s);
    };
    st.commit = [&](size_t i, size_t s) {
      mon.on_commit(i, s);
      if (i % 5 == 0) {  // released inside commit()
        mon.on_release(i, s);
        pp->release(i);
        return;
      }
      ++outstanding;
      late.post([&, i, s] {
        mon.on_release(i, s);
        --outstanding;
        pp->release(i);
      });
    };
    st.commit_releases_later = true;
    OrderedPipeline p(n, window, st);
    pp = &p;
    p.run(3u);
    EXPECT_EQ(outstanding.load(), 0);  // run() returned only after every release
  }
  EXPECT_EQ(mon.violations.load(), 0);
  EXPECT_EQ(mon.committed, iota_n(n));
  EXPECT_LE(mon.max_in_flight.load(), (long)window);
}

// Output placed by work straight at its final position when every earlier
// item is committed, else copied by commit: the result is the same.
TEST(OrderedPipeline, DirectPlacementWhenNextInLine) {
  const size_t n = 300;
  std::vector<std::vector<uint8_t>> bufs(4);
  std::vector<uint8_t> out;
  std::vector<char> direct(n);  // not vector<bool>: items write neighbouring entries concurrently
  size_t pos = 0;
  auto bytes_of = [](size_t i) { return std::vector<uint8_t>(1 + i % 13, (uint8_t)i); };
  out.resize(n * 13);
  OrderedPipeline* pp = nullptr;
  OrderedPipeline::Stages st;
  size_t n_direct = 0;
  st.work = [&](size_t i, size_t s, unsigned) {
    jitter(i, 1);
    const auto b = bytes_of(i);
    direct[i] = pp->all_before_committed(i);
    if (direct[i])
      std::copy(b.begin(), b.end(), out.begin() + (long)pos);
    else
      bufs[s] = b;
  };
  st.commit = [&](size_t i, size_t s) {
    const auto b = bytes_of(i);
    if (!direct[i]) std::copy(bufs[s].begin(), bufs[s].end(), out.begin() + (long)pos);
    n_direct += direct[i];
    pos += b.size();
  };
  OrderedPipeline p(n, 4, st);
  pp = &p;
  p.run(4u);
  std::vector<uint8_t> want;
  for (size_t i = 0; i < n; ++i) {
    const auto b = bytes_of(i);
    want.insert(want.end(), b.begin(), b.end());
  }
  out.resize(pos);
  EXPECT_EQ(out, want);
  EXPECT_GT(n_direct, 0u);
}

// The first error wins: it is rethrown, the items after it are never
// committed, and at most `window` items are ever issued past it.
TEST(OrderedPipeline, FirstErrorWinsAndStopsTheRest) {
  for (unsigned threads : {1u, 2u, 8u}) {
    const size_t n = 500, window = 4, bad = 37;
    std::atomic<size_t> max_issued{0};
    std::vector<size_t> committed;
    std::atomic<int> later_errors{0};
    OrderedPipeline::Stages st;
    st.issue = [&](size_t i, size_t) {
      for (size_t m = max_issued.load(); i > m && !max_issued.compare_exchange_weak(m, i);) {
      }
    };
    st.work = [&](size_t i, size_t, unsigned) {
      jitter(i, 1);
      if (i == bad) throw std::runtime_error("item 37 failed");
      if (i > bad + 2 * window) ++later_errors;  // never reached
    };
    st.commit = [&](size_t i, size_t) { committed.push_back(i); };
    OrderedPipeline p(n, window, st);
    try {
      p.run(threads);
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "item 37 failed");
    }
    EXPECT_EQ(later_errors.load(), 0);
    EXPECT_LE(committed.size(), bad);
    EXPECT_EQ(committed, iota_n(committed.size()));
    EXPECT_LT(max_issued.load(), bad + window);
  }
}

// The first of two failures is the one rethrown; a commit failure too.
TEST(OrderedPipeline, CommitErrorIsRethrown) {
  OrderedPipeline::Stages st;
  st.work = [&](size_t, size_t, unsigned) {};
  st.commit = [&](size_t i, size_t) {
    if (i == 10) throw std::out_of_range("commit 10");
  };
  OrderedPipeline p(100, 3, st);
  EXPECT_THROW(p.run(3u), std::out_of_range);
}

// Cancellation from another thread (fail()), and through poll.
TEST(OrderedPipeline, CancelStopsTheRun) {
  std::atomic<size_t> worked{0};
  OrderedPipeline* pp = nullptr;
  OrderedPipeline::Stages st;
  st.work = [&](size_t i, size_t, unsigned) {
    jitter(i, 1);
    ++worked;
  };
  OrderedPipeline p(1000000, 8, st);
  pp = &p;
  std::atomic<bool> returned{false};
  std::thread canceller([&] {
    while (worked.load() < 50 && !returned.load()) std::this_thread::yield();
    pp->fail(std::make_exception_ptr(std::runtime_error("cancelled")));
  });
  EXPECT_THROW(p.run(4u), std::runtime_error);
  returned = true;
  canceller.join();
  EXPECT_LT(worked.load(), 1000000u);

  std::atomic<bool> stop{false};
  std::atomic<size_t> committed{0};
  OrderedPipeline::Stages st2;
  st2.work = [&](size_t i, size_t, unsigned) {
    if (i == 20) stop = true;
  };
  st2.commit = [&](size_t, size_t) { ++committed; };
  st2.poll = [&] {
    if (stop.load()) throw std::runtime_error("interrupted");
  };
  OrderedPipeline p2(1000, 4, st2);
  EXPECT_THROW(p2.run(2u), std::runtime_error);
  EXPECT_LE(committed.load(), 21u);
}

// After an error, run() still waits for the completions it is owed, so no
// callback touches the caller's state after it returned.
TEST(OrderedPipeline, ErrorWaitsForOwedCompletions) {
  std::atomic<long> pending{0};
  std::atomic<bool> returned{false};
  std::atomic<int> after_return{0};
  {
    LateCaller late;
    OrderedPipeline* pp = nullptr;
    OrderedPipeline::Stages st;
    st.issue = [&](size_t i, size_t) {
      ++pending;
      late.post([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (returned.load()) ++after_return;
        --pending;
        pp->ready(i);
      });
    };
    st.issue_completes_later = true;
    st.work = [&](size_t i, size_t, unsigned) {
      if (i == 3) throw std::runtime_error("work 3");
    };
    OrderedPipeline p(200, 8, st);
    pp = &p;
    EXPECT_THROW(p.run(2u), std::runtime_error);
    returned = true;
    EXPECT_EQ(pending.load(), 0);
  }
  EXPECT_EQ(after_return.load(), 0);
}

TEST(OrderedPipeline, AsynchronousFailureStops) {
  OrderedPipeline* pp = nullptr;
  OrderedPipeline::Stages st;
  st.issue = [&](size_t i, size_t) {
    pp->ready(i, i == 5 ? std::make_exception_ptr(std::runtime_error("read 5 failed")) : nullptr);
  };
  st.issue_completes_later = true;
  std::atomic<size_t> max_worked{0};
  st.work = [&](size_t i, size_t, unsigned) {
    for (size_t m = max_worked.load(); i > m && !max_worked.compare_exchange_weak(m, i);) {
    }
  };
  OrderedPipeline p(1000, 2, st);
  pp = &p;
  try {
    p.run(2u);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "read 5 failed");
  }
  EXPECT_LT(max_worked.load(), 10u);
}

}  // namespace

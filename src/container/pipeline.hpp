// The container's read -> code -> write passes (compress_file, export,
// verify) on the project's ordered pipeline (common/ordered_pipeline.h):
// produce prepares item i in order (reads), work transforms items in
// parallel in any order (codec), consume takes them in order (writes). All
// three run on `threads` threads in total, the calling thread included; at
// most slots.size() items are alive at once, so memory is bounded by slots x
// item size, independent of the input size. The first exception thrown by
// any stage (or a cancellation request, check_cancel) stops the others and
// is rethrown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/ordered_pipeline.h"
#include "file_io.hpp"

namespace tz::container::detail {

// Consecutive items that go through run_pipeline as one: a file of 10^5
// small tensors would otherwise spend most of its time handing single
// frames between threads (a sleep and a wake-up each). Items are grouped in
// order until a group holds kGroupBytes or kGroupItems; an item of
// kGroupBytes or more travels alone, so memory stays slots x one chunk.
constexpr uint64_t kGroupBytes = 1u << 20;
constexpr size_t kGroupItems = 4096;
struct ItemGroup {
  size_t first = 0, count = 0;
};
template <class SizeOf>
std::vector<ItemGroup> group_items(size_t n, SizeOf&& size_of) {
  std::vector<ItemGroup> g;
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t b = size_of(i);
    if (g.empty() || bytes + b > kGroupBytes || g.back().count == kGroupItems) {
      g.push_back(ItemGroup{i, 0});
      bytes = 0;
    }
    ++g.back().count;
    bytes += b;
  }
  return g;
}

// The buffers of a pipeline's items, handed out most recently returned
// first. OrderedPipeline gives item i the slot i % window, so a run whose
// items are mostly one at a time (one thread; or work faster than the
// reads) would cycle through every slot's buffers and first-touch (page
// fault) window times the memory one item needs; taking buffers from here
// when an item starts and returning them when its slot is free keeps the
// few warm ones in use. Holds `n` sets, created on first use; take() never
// waits: the pipeline keeps at most window <= n items between start and
// return.
template <class T>
class ReusePool {
 public:
  explicit ReusePool(size_t n) : all_(n) {}
  ReusePool(const ReusePool&) = delete;
  ReusePool& operator=(const ReusePool&) = delete;
  T* take() {
    std::lock_guard<std::mutex> lk(mu_);
    if (!free_.empty()) {
      T* t = free_.back();
      free_.pop_back();
      return t;
    }
    if (made_ == all_.size()) fail(ErrorKind::kInternal, "pipeline buffers exhausted");
    all_[made_] = std::make_unique<T>();
    return all_[made_++].get();
  }
  void give(T* t) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(t);
  }
  size_t made() const { return made_; }  // distinct sets used so far

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<T>> all_;
  std::vector<T*> free_;
  size_t made_ = 0;
};

// Runs produce (in order), work (in parallel) and consume (in order) over
// n_items items on `threads` threads, at most `window` in flight; each item
// gets a Slot from `pool` (ReusePool: the most recently freed first) from
// produce until consume returned, so a slot's buffers are reused across
// items. pool must hold >= window sets.
template <class Slot, class Produce, class Work, class Consume>
void run_pipeline(size_t n_items, size_t window, ReusePool<Slot>& pool, unsigned threads, Produce&& produce,
                  Work&& work, Consume&& consume) {
  if (n_items == 0) return;
  std::vector<Slot*> at(window, nullptr);  // pipeline slot -> the buffers its item holds
  tz::cpu::OrderedPipeline::Stages st;
  st.issue = [&](size_t i, size_t s) {
    at[s] = pool.take();
    produce(i, *at[s]);
  };
  st.work = [&](size_t i, size_t s, unsigned w) { work(i, *at[s], w); };
  st.commit = [&](size_t i, size_t s) {
    consume(i, *at[s]);
    pool.give(at[s]);
    at[s] = nullptr;
  };
  st.poll = check_cancel;
  tz::cpu::OrderedPipeline p(n_items, window, std::move(st));
  p.run(threads);
}

}  // namespace tz::container::detail

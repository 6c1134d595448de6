// The container's read -> code -> write passes (compress_file, export,
// verify) on the project's ordered pipeline (cpu/ordered_pipeline.h):
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
#include <vector>

#include "cpu/ordered_pipeline.h"
#include "tzc_io.hpp"

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

template <class Slot, class Produce, class Work, class Consume>
void run_pipeline(size_t n_items, std::vector<Slot>& slots, unsigned threads, Produce&& produce, Work&& work,
                  Consume&& consume) {
  if (n_items == 0) return;
  tz::cpu::OrderedPipeline::Stages st;
  st.issue = [&](size_t i, size_t s) { produce(i, slots[s]); };
  st.work = [&](size_t i, size_t s, unsigned w) { work(i, slots[s], w); };
  st.commit = [&](size_t i, size_t s) { consume(i, slots[s]); };
  st.poll = check_cancel;
  tz::cpu::OrderedPipeline p(n_items, slots.size(), std::move(st));
  p.run(threads);
}

}  // namespace tz::container::detail

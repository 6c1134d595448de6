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
#include <vector>

#include "cpu/ordered_pipeline.h"
#include "tzc_io.hpp"

namespace tz::container::detail {

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

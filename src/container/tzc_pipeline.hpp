// Ordered three-stage pipeline: a producer thread prepares items in order
// (reads), W workers transform them in any order (codec), the calling thread
// consumes them in order (writes). At most `slots` items are alive at once,
// so memory is bounded by slots x item size, independent of the input size.
// The first exception thrown by any stage stops the others and is rethrown.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

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
void run_pipeline(size_t n_items, std::vector<Slot>& slots, unsigned workers, Produce&& produce, Work&& work,
                  Consume&& consume) {
  if (n_items == 0) return;
  const size_t n_slots = slots.size();
  enum State { kFree, kProduced, kWorking, kDone };
  std::vector<State> state(n_slots, kFree);
  std::vector<size_t> item_of(n_slots, 0);
  std::mutex mu;
  std::condition_variable cv;
  size_t next_produce = 0, next_consume = 0;
  bool stop = false;
  std::exception_ptr error;

  auto set_error = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(mu);
    if (!error) error = e;
    stop = true;
    cv.notify_all();
  };

  // Threads are started through start(): if the system refuses one (EAGAIN),
  // those already running are stopped and joined and the failure becomes an
  // Error (a joinable std::thread destroyed by the unwinding would call
  // std::terminate).
  std::thread producer;
  std::vector<std::thread> pool;
  pool.reserve(workers);
  auto start = [&](auto&& fn) {
    try {
      return std::thread(std::forward<decltype(fn)>(fn));
    } catch (const std::system_error& e) {
      {
        std::lock_guard<std::mutex> lk(mu);
        stop = true;
        cv.notify_all();
      }
      if (producer.joinable()) producer.join();
      for (auto& t : pool) t.join();
      fail(ErrorKind::kInternal, std::string("cannot start a thread: ") + e.what());
    }
  };

  producer = start([&] {
    try {
      for (size_t i = 0; i < n_items; ++i) {
        const size_t s = i % n_slots;
        {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return stop || state[s] == kFree; });
          if (stop) return;
        }
        check_cancel();
        produce(i, slots[s]);
        std::lock_guard<std::mutex> lk(mu);
        state[s] = kProduced;
        item_of[s] = i;
        next_produce = i + 1;
        cv.notify_all();
      }
    } catch (...) {
      set_error(std::current_exception());
    }
  });

  for (unsigned w = 0; w < workers; ++w) {
    pool.push_back(start([&, w] {
      for (;;) {
        size_t s = 0;
        {
          std::unique_lock<std::mutex> lk(mu);
          // Take the produced item with the lowest index: keeps the consumer fed.
          bool found = false;
          cv.wait(lk, [&] {
            if (stop) return true;
            size_t best = (size_t)-1;
            for (size_t k = 0; k < n_slots; ++k)
              if (state[k] == kProduced && item_of[k] < best) {
                best = item_of[k];
                s = k;
                found = true;
              }
            if (found) return true;
            // Nothing left to produce and nothing waiting: done.
            return next_produce == n_items;
          });
          if (stop || !found) return;
          state[s] = kWorking;
        }
        try {
          work(item_of[s], slots[s], w);
        } catch (...) {
          set_error(std::current_exception());
          return;
        }
        std::lock_guard<std::mutex> lk(mu);
        state[s] = kDone;
        cv.notify_all();
      }
    }));
  }

  try {
    while (next_consume < n_items) {
      const size_t s = next_consume % n_slots;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || (state[s] == kDone && item_of[s] == next_consume); });
        if (stop) break;
      }
      consume(next_consume, slots[s]);
      std::lock_guard<std::mutex> lk(mu);
      state[s] = kFree;
      ++next_consume;
      cv.notify_all();
    }
  } catch (...) {
    set_error(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    if (next_consume == n_items) stop = true;  // wake idle workers
    cv.notify_all();
  }
  producer.join();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace tz::container::detail

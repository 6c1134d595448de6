#include "common/ordered_pipeline.h"

#include <algorithm>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "common/thread_pool.h"

namespace tz::cpu {

OrderedPipeline::OrderedPipeline(size_t n_items, size_t window, Stages stages)
    : n_(n_items), st_(std::move(stages)), slots_(window ? window : 1) {
  if (!st_.work) throw std::invalid_argument("OrderedPipeline: a work stage is required");
  if (st_.issue_completes_later && !st_.issue)
    throw std::invalid_argument("OrderedPipeline: issue_completes_later without an issue stage");
  if (st_.commit_releases_later && !st_.commit)
    throw std::invalid_argument("OrderedPipeline: commit_releases_later without a commit stage");
}

void OrderedPipeline::set_error_locked(std::exception_ptr e) {
  if (!error_) error_ = std::move(e);
  cv_.notify_all();
}

void OrderedPipeline::free_slot_locked(Slot& s) {
  s.state = State::kFree;
  ++released_;
  cv_.notify_all();
}

// A stage call that threw owes no completion (the stage contract): the
// count of completions still to come forgets it.
void OrderedPipeline::settle_owed_locked(Slot& s) {
  if (!s.owes) return;
  s.owes = false;
  --owed_;
  cv_.notify_all();
}

template <class F>
bool OrderedPipeline::call(std::unique_lock<std::mutex>& lk, F&& f) {
  lk.unlock();
  std::exception_ptr e;
  try {
    if (st_.poll) st_.poll();
    f();
  } catch (...) {
    e = std::current_exception();
  }
  lk.lock();
  if (!e) return true;
  set_error_locked(std::move(e));
  return false;
}

void OrderedPipeline::loop(unsigned worker) {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (released_ == n_) return;
    if (error_) {
      // No thread leaves while completions are owed: an asynchronous read
      // may complete through the thread that submitted it (io_uring task
      // work), which must still exist then.
      if (owed_ == 0) return;
      cv_.wait(lk);
      continue;
    }

    // 1. Commit what is next in line: it frees slots and keeps output flowing.
    if (st_.commit && !committing_ && next_commit_ < next_issue_) {
      Slot& s = slot_of(next_commit_);
      if (s.item == next_commit_ && s.state == State::kDone) {
        const size_t i = next_commit_;
        s.state = State::kCommitting;
        s.early = false;
        if (st_.commit_releases_later) s.owes = true, ++owed_;
        committing_ = true;
        const bool ok = call(lk, [&] { st_.commit(i, i % slots_.size()); });
        committing_ = false;
        if (!ok) {
          settle_owed_locked(s);
          continue;
        }
        ++next_commit_;
        if (!st_.commit_releases_later || s.early)
          free_slot_locked(s);
        else
          s.state = State::kCommitted;
        cv_.notify_all();
        continue;
      }
    }

    // 2. Issue the next item when its slot is free and fewer items wait for
    // work than there are threads (so issue does not run far ahead).
    if (!issuing_ && next_issue_ < n_ && workable_.size() < read_ahead_) {
      Slot& s = slot_of(next_issue_);
      if (s.state == State::kFree) {
        const size_t i = next_issue_++;
        s.item = i;
        s.early = false;
        if (!st_.issue) {
          s.state = State::kReady;
          workable_.push(i);
          cv_.notify_all();
          continue;
        }
        s.state = State::kIssuing;
        if (st_.issue_completes_later) s.owes = true, ++owed_;
        issuing_ = true;
        const bool ok = call(lk, [&] { st_.issue(i, i % slots_.size()); });
        issuing_ = false;
        if (!ok) {
          settle_owed_locked(s);
          continue;
        }
        if (!st_.issue_completes_later || s.early) {
          s.state = State::kReady;
          workable_.push(i);
        } else {
          s.state = State::kIssued;
        }
        cv_.notify_all();
        continue;
      }
    }

    // 3. Work on the lowest workable item.
    if (!workable_.empty()) {
      const size_t i = workable_.top();
      workable_.pop();
      Slot& s = slot_of(i);
      s.state = State::kWorking;
      if (!call(lk, [&] { st_.work(i, i % slots_.size(), worker); })) continue;
      if (st_.commit)
        s.state = State::kDone;
      else
        free_slot_locked(s);
      cv_.notify_all();
      continue;
    }

    cv_.wait(lk);
  }
}

void OrderedPipeline::run(unsigned threads) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (ran_) throw std::logic_error("OrderedPipeline::run called twice");
    ran_ = true;
    threads_ = threads ? threads : 1;
    read_ahead_ = st_.read_ahead ? st_.read_ahead : threads_;
  }
  if (n_ == 0) return;
  std::vector<std::thread> pool;
  const unsigned want = (unsigned)std::min<size_t>(threads_, n_);
  pool.reserve(want - 1);
  {
    // Threads that cannot start (EAGAIN under a process limit) are simply
    // not there: fewer threads give the same result.
    std::lock_guard<std::mutex> lk(mu_);
    for (unsigned w = 1; w < want; ++w) {
      try {
        pool.emplace_back([this, w] { loop(w); });
      } catch (const std::system_error&) {
        break;
      }
    }
    threads_ = (unsigned)pool.size() + 1;
    if (!st_.read_ahead) read_ahead_ = threads_;
  }
  loop(0);
  for (auto& t : pool) t.join();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return owed_ == 0; });
  if (error_) std::rethrow_exception(error_);
}

void OrderedPipeline::run(ThreadPool& pool) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (ran_) throw std::logic_error("OrderedPipeline::run called twice");
    ran_ = true;
    threads_ = pool.size();
    read_ahead_ = st_.read_ahead ? st_.read_ahead : threads_;
  }
  // One task per pool thread, each the scheduling loop; a thread that gets
  // a second task finds the pipeline finished.
  pool.parallel_for(pool.size(), [this](size_t, unsigned w) { loop(w); });
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return owed_ == 0; });
  if (error_) std::rethrow_exception(error_);
}

void OrderedPipeline::ready(size_t item, std::exception_ptr error) {
  std::lock_guard<std::mutex> lk(mu_);
  Slot& s = slot_of(item);
  if (s.item != item || !s.owes) return;  // not owed (its issue() threw)
  s.owes = false;
  --owed_;
  if (error) set_error_locked(std::move(error));
  if (s.state == State::kIssuing) {
    s.early = true;
  } else if (s.state == State::kIssued) {
    s.state = State::kReady;
    workable_.push(item);
  }
  cv_.notify_all();
}

void OrderedPipeline::release(size_t item) {
  std::lock_guard<std::mutex> lk(mu_);
  Slot& s = slot_of(item);
  if (s.item != item || !s.owes) return;  // not owed (its commit() threw)
  s.owes = false;
  --owed_;
  if (s.state == State::kCommitting)
    s.early = true;
  else if (s.state == State::kCommitted)
    free_slot_locked(s);
  cv_.notify_all();
}

void OrderedPipeline::fail(std::exception_ptr e) {
  std::lock_guard<std::mutex> lk(mu_);
  set_error_locked(std::move(e));
}

bool OrderedPipeline::all_before_committed(size_t item) {
  std::lock_guard<std::mutex> lk(mu_);
  return next_commit_ == item && !committing_;
}

}  // namespace tz::cpu

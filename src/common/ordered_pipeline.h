// The project's one ordered, bounded pipeline. Items 0..n-1 go through up
// to three stages:
//
//   issue(i, slot)          optional; in item order, one call at a time
//                           (e.g. submit a read). It may finish later: the
//                           item is then workable once ready(i) is called.
//   work(i, slot, worker)   in parallel, in any order (e.g. encode, decode)
//   commit(i, slot)         optional; in item order, one call at a time
//                           (e.g. assign the file offset, hash, write). The
//                           slot may stay taken until release(i) (e.g. an
//                           asynchronous write still reads from it).
//
// Item i uses slot i % window, and is issued only once item i - window has
// left its slot: at most `window` items are between issue and release, so
// memory is bounded by window x slot size, whatever n is.
//
// Every stage runs on the threads given to run() (the calling thread is one
// of them; no thread is started just to read or to write): a thread commits
// what is next in line, else issues when few items wait for work, else works
// on the lowest workable item, else sleeps. One thread therefore runs the
// stages strictly one after the other (unless read_ahead asks it to issue
// further ahead), and N threads share all of them.
//
// The first exception thrown by a stage or `poll`, or passed to ready() or
// fail(), wins: no stage call starts after it, and run() rethrows it once
// the calls in progress returned and every asynchronous completion owed
// (ready() of an issued item, release() of a committed one) arrived, so
// the caller's buffers are never touched after run() returns; no thread of
// the run exits before then either (io_uring completes some reads through
// the submitting thread). Cancellation is fail() from any thread, or a
// `poll` that throws. An issue() or commit() that throws owes no
// completion.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <queue>
#include <vector>

namespace tz::cpu {

class ThreadPool;

class OrderedPipeline {
 public:
  struct Stages {
    std::function<void(size_t item, size_t slot)> issue;  // optional
    // issue() starts asynchronous work: the item waits for ready(item).
    bool issue_completes_later = false;
    // Issue runs ahead while fewer than this many items wait for work
    // (0: the thread count). E.g. 2 on one thread: item k+1 is issued
    // before item k is worked on (double buffering).
    size_t read_ahead = 0;
    std::function<void(size_t item, size_t slot, unsigned worker)> work;  // required
    std::function<void(size_t item, size_t slot)> commit;  // optional
    // A committed item keeps its slot until release(item).
    bool commit_releases_later = false;
    // Called before every stage call; throw to stop (e.g. on a cancellation request).
    std::function<void()> poll;
  };

  // window >= 1: items in flight (slots). n_items may be 0.
  OrderedPipeline(size_t n_items, size_t window, Stages stages);
  OrderedPipeline(const OrderedPipeline&) = delete;
  OrderedPipeline& operator=(const OrderedPipeline&) = delete;

  // Runs every item through the stages with `threads` threads in total, the
  // caller included (0 is taken as 1); worker ids are 0..threads-1. Returns
  // when all items are done; rethrows the first error. Call once.
  void run(unsigned threads);
  // The same on the threads of `pool` (worker ids 0..pool.size()-1). The
  // pool must not be running another loop.
  void run(ThreadPool& pool);

  // From any thread, exactly once for each issued item when
  // issue_completes_later: the asynchronous part of issue(item) finished
  // (error: it failed, which stops the pipeline as fail() does).
  void ready(size_t item, std::exception_ptr error = nullptr);
  // From any thread, exactly once for each committed item when
  // commit_releases_later: its slot may be reused.
  void release(size_t item);
  // Stops the pipeline with e unless an error was recorded already.
  void fail(std::exception_ptr e);

  // True when every item before `item` is committed (or, without a commit
  // stage, released). A worker may use it to put item's output straight
  // where commit would copy it: nothing else is committed until item is.
  bool all_before_committed(size_t item);

 private:
  enum class State : uint8_t { kFree, kIssuing, kIssued, kReady, kWorking, kDone, kCommitting, kCommitted };
  struct Slot {
    size_t item = 0;
    State state = State::kFree;
    bool owes = false;   // a ready() or release() for this item is still to come
    bool early = false;  // it came while issue() or commit() was still running
  };
  void loop(unsigned worker);
  // Runs one stage call (poll first) without the lock; false if it threw.
  template <class F>
  bool call(std::unique_lock<std::mutex>& lk, F&& f);
  void set_error_locked(std::exception_ptr e);
  void free_slot_locked(Slot& s);
  void settle_owed_locked(Slot& s);
  Slot& slot_of(size_t item) { return slots_[item % slots_.size()]; }

  const size_t n_;
  Stages st_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  unsigned threads_ = 1;
  size_t read_ahead_ = 1;   // st_.read_ahead, or the thread count
  size_t next_issue_ = 0;   // next item to issue
  size_t next_commit_ = 0;  // next item to commit
  size_t released_ = 0;     // items whose slot is free again
  size_t owed_ = 0;         // asynchronous completions still to come
  std::priority_queue<size_t, std::vector<size_t>, std::greater<size_t>> workable_;  // items in kReady
  bool issuing_ = false, committing_ = false;
  bool ran_ = false;
  std::exception_ptr error_;
};

}  // namespace tz::cpu

// A small fixed-size thread pool for data-parallel loops over blocks.
// Exceptions of tasks reach the caller of parallel_for (the C API turns
// std::bad_alloc into TZ_ERROR_ALLOCATION); none ends the process.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tz::cpu {

class ThreadPool {
 public:
  // threads == 0: std::thread::hardware_concurrency(). The calling thread
  // takes part in every loop, so ThreadPool(1) starts no thread at all.
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return n_workers_; }

  // Runs fn(task, worker) for task in [0, n_tasks); worker in [0, size()).
  // Tasks are handed out in increasing order. Blocks until all are done.
  // If fn throws (e.g. std::bad_alloc in a worker), no further task starts,
  // the running ones finish, and the first exception is rethrown here, on
  // the calling thread (never std::terminate in a worker).
  void parallel_for(size_t n_tasks, const std::function<void(size_t, unsigned)>& fn);

 private:
  void worker_loop(unsigned worker);
  void run_tasks(unsigned worker);
  void stop_and_join();

  unsigned n_workers_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(size_t, unsigned)>* job_ = nullptr;
  size_t n_tasks_ = 0;
  size_t next_task_ = 0;
  unsigned busy_ = 0;
  unsigned long generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;  // first exception of the current loop's tasks
};

}  // namespace tz::cpu

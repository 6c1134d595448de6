#include "common/thread_pool.h"

namespace tz::cpu {

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::thread::hardware_concurrency();
  if (threads == 0) threads = 1;
  n_workers_ = threads;
  try {
    for (unsigned w = 1; w < threads; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
  } catch (...) {  // a thread could not start: stop the ones that did (joinable threads must not be destroyed)
    stop_and_join();
    throw;
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void ThreadPool::run_tasks(unsigned worker) {
  for (;;) {
    size_t task;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (next_task_ >= n_tasks_) return;
      task = next_task_++;
    }
    try {
      (*job_)(task, worker);
    } catch (...) {
      // First failure wins; the tasks not yet handed out are dropped, the
      // ones running finish, and parallel_for rethrows on its caller.
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
      next_task_ = n_tasks_;
    }
  }
}

void ThreadPool::worker_loop(unsigned worker) {
  unsigned long seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++busy_;
    }
    run_tasks(worker);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--busy_ == 0) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(size_t n_tasks, const std::function<void(size_t, unsigned)>& fn) {
  if (n_tasks == 0) return;
  if (n_workers_ == 1 || n_tasks == 1) {
    for (size_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    n_tasks_ = n_tasks;
    next_task_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  cv_start_.notify_all();
  run_tasks(0);
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return busy_ == 0 && next_task_ >= n_tasks_; });
    job_ = nullptr;
    n_tasks_ = 0;
    err.swap(error_);
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace tz::cpu

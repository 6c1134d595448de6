// SIGINT, SIGTERM, SIGHUP: cancel cleanly at any moment.
//
// The handler only sets flags (async-signal-safe): the library's cancel flag,
// which every running operation checks at its next chunk, then unwinds and
// removes its temporaries (an existing output is never touched before the
// final rename, and no rename starts after the flag is set). A watchdog
// thread, woken by the handler through a semaphore, gives that unwinding a
// short grace period; if tzip is still running then (e.g. inside the parse
// of a large header, which has no chunk boundary), or at once on a second
// signal, it removes every registered temporary itself
// (tc::remove_temporaries waits for a rename in progress, and nothing is
// created or published after it) and ends the process with the signal.
// A command that succeeded (its outputs published) exits 0 even when a
// signal came after its last rename; one that did not dies by the signal.
#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <ctime>
#include <thread>

#include "tzip_cli.hpp"

namespace tzip {

namespace {
std::atomic<int> g_first_signal{0};
std::atomic<int> g_count{0};
std::atomic<bool> g_finished{false};  // the command succeeded; exiting 0
sem_t g_wake;
constexpr double kGraceSeconds = 0.5;

void on_signal(int sig) {
  int expected = 0;
  g_first_signal.compare_exchange_strong(expected, sig);
  g_count.fetch_add(1);
  tc::request_cancel();
  sem_post(&g_wake);  // async-signal-safe
}

void watchdog() {
  while (sem_wait(&g_wake) != 0 && errno == EINTR) {
  }
  // Grace period for the ordinary unwinding (main exits by itself), cut
  // short by a second signal.
  struct timespec until {};
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += (long)(kGraceSeconds * 1e9);
  until.tv_sec += until.tv_nsec / 1000000000L;
  until.tv_nsec %= 1000000000L;
  while (sem_timedwait(&g_wake, &until) != 0 && errno == EINTR) {
  }
  if (g_finished.load()) return;  // main is exiting with its outputs in place
  tc::remove_temporaries();
  die_by_signal(g_first_signal.load());
}
}  // namespace

void install_signals() {
  sem_init(&g_wake, 0, 0);
  std::thread(watchdog).detach();
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking open of a FIFO returns EINTR
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);
  // Exceeding RLIMIT_FSIZE must be a write error (EFBIG), not a silent
  // kill; a closed pipe on stdout a write error (EPIPE), not a kill that
  // leaves temporaries.
  signal(SIGXFSZ, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
}

int pending_signal() { return g_first_signal.load(); }

void finish_signals() { g_finished.store(true); }

void die_by_signal(int sig) {
  if (sig <= 0) sig = SIGTERM;
  signal(sig, SIG_DFL);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, sig);
  pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
  raise(sig);
  _exit(128 + sig);  // not reached
}

}  // namespace tzip

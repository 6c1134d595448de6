// tzip: command-line front end of the .tzip container (doc/cli.md).
// Uses only the public headers. Every failure is one line on stderr,
// "tzip: <file>: <problem>", and a documented exit status. The parts:
// tzip_cli.hpp.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "tzip_cli.hpp"

#ifdef TZ_HAVE_PLAN
int tzip_plan_main(int argc, char** argv);  // programs/tzip_plan.cpp
#endif

namespace tzip {

int verbosity = 1;

// ---- formatting ------------------------------------------------------------
std::string human(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (bytes >= 1000 && u < 5) {
    bytes /= 1000;
    ++u;
  }
  char b[32];
  std::snprintf(b, sizeof b, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return b;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string ratio_str(uint64_t raw, uint64_t comp) { return comp ? fmt("%.3f", (double)raw / comp) : "-"; }

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void say(const std::string& s) {
  if (verbosity >= 1) std::fprintf(stderr, "%s\n", tc::printable(s).c_str());
}

// ---- progress bar ------------------------------------------------------------
Progress::Progress(std::string label) : label_(tc::printable(label)) {
  enabled_ = verbosity >= 1 && isatty(STDERR_FILENO);
  start_ = now_s();
}

tc::ProgressFn Progress::fn() {
  if (!enabled_) return nullptr;
  return [this](uint64_t d, uint64_t t) { update(d, t); };
}

void Progress::update(uint64_t done, uint64_t total) {
  const double t = now_s();
  if (t - last_ < 0.1 && done < total) return;
  last_ = t;
  const double el = std::max(t - start_, 1e-6);
  const double frac = total ? std::min(1.0, (double)done / (double)total) : 1.0;
  const double speed = done / el;
  const int width = 24;
  const int fill = (int)(frac * width);
  std::string bar(fill, '=');
  if (fill < width) bar += '>' + std::string(width - fill - 1, ' ');
  std::string eta = "--";
  if (speed > 0 && done < total) eta = fmt("%.0fs", (total - done) / speed);
  std::fprintf(stderr, "\r%s [%s] %3.0f%% %s / %s  %s/s  ETA %s   ", label_.c_str(), bar.c_str(), frac * 100,
               human(done).c_str(), human(total).c_str(), human(speed).c_str(), eta.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

// One line for an error: the spooled standard input is called "stdin", and
// an existing output says how to replace it.
std::string error_line(const std::string& what, tc::ErrorKind kind) {
  std::string m = stdin_in_message(what);
  const std::string tail = ": already exists";
  if (kind == tc::ErrorKind::kExists && m.size() >= tail.size() && m.compare(m.size() - tail.size(), tail.size(), tail) == 0)
    m += " (use -f to overwrite)";
  return "tzip: " + tc::printable(m);
}

int run(int argc, char** argv) {
  install_signals();
  Args a;
  try {
    a = parse_args(argc, argv);
    if (a.command == "-V" || a.command == "--version") return print_version();
    if (a.help) {
      std::fputs(a.command.empty() ? kMainHelp : help_for(a.command), stdout);
      return kExitOk;
    }
    if (a.command == "compress") return cmd_compress(a);
    if (a.command == "decompress") return cmd_decompress(a);
    if (a.command == "inspect") return cmd_inspect(a);
    if (a.command == "verify") return cmd_verify(a);
    if (a.command == "rebase") return cmd_rebase(a);
    if (a.command == "bench") return cmd_bench(a);
    throw UsageError("unknown command '" + a.command + "'");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "tzip: %s\n", tc::printable(e.what()).c_str());
    return kExitUsage;
  } catch (const tc::Error& e) {
    std::fprintf(stderr, "%s\n", error_line(e.what(), e.kind()).c_str());
    switch (e.kind()) {
      case tc::ErrorKind::kUsage: return kExitUsage;
      case tc::ErrorKind::kBadInput: return kExitBadInput;
      case tc::ErrorKind::kIO: return kExitIO;
      case tc::ErrorKind::kExists: return kExitExists;
      case tc::ErrorKind::kInterrupted: return kExitSignal;
      default: return kExitInternal;
    }
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tzip: out of memory\n");
    return kExitInternal;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tzip: internal error: %s\n", tc::printable(e.what()).c_str());
    return kExitInternal;
  }
}

}  // namespace tzip

int main(int argc, char** argv) {
#ifdef TZ_HAVE_PLAN
  if (argc >= 2 && std::string(argv[1]) == "plan") return tzip_plan_main(argc - 1, argv + 1);
#endif
  const int rc = tzip::run(argc, argv);
  // Done: every output is in place, whether or not a signal came late.
  if (rc == tzip::kExitOk) tzip::finish_signals();
  std::fflush(stdout);
  // Interrupted: the temporaries are gone (the library unwound); end as the
  // signal would have, so that a calling shell or script sees it.
  if (rc != tzip::kExitOk)
    if (const int sig = tzip::pending_signal()) tzip::die_by_signal(sig);
  return rc;
}

// tzip: declarations shared by the parts of the command-line tool
// (doc/cli.md). Public headers of the library only.
//   tzip.cpp          main: dispatch, error -> exit status
//   tzip_args.cpp     command line: options, bundled short flags, help texts
//   tzip_signals.cpp  SIGINT/SIGTERM/SIGHUP: cancel, and a watchdog that cleans up
//   tzip_stdin.cpp    standard input: checked as it arrives, spooled to a temporary file
//   tzip_paths.cpp    where outputs go (-o folder, defaults, stdout), --rm
//   tzip_compress.cpp compress, decompress, rebase
//   tzip_info.cpp     inspect, verify, bench, --version
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "container/cli_support.hpp"  // src/container: the CLI's helpers of the container
#include "tensorzip/container.hpp"

namespace tzip {

namespace tc = tz::container;

// ---- exit codes (doc/cli.md) ----------------------------------------------
enum Exit {
  kExitOk = 0,
  kExitUsage = 1,
  kExitBadInput = 2,
  kExitIO = 3,
  kExitExists = 4,
  kExitInternal = 5,
  kExitSignal = 130,
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

extern int verbosity;  // 0 quiet, 1 normal, 2 verbose

struct Args {
  std::string command;
  std::vector<std::string> inputs;  // "-": standard input
  std::string output;               // "-": standard output
  std::string against;
  bool force = false, json = false, help = false;
  bool to_stdout = false;    // -c / --stdout / -o -
  bool remove_inputs = false;  // --rm (-k, the default, keeps them)
  bool independent = false;  // --independent: no output needs another output
  bool have_level = false;
  int level = 0;
  unsigned threads = 0;  // 0: all cores (-T0, the default)
  unsigned block_elems = 0;
  uint64_t chunk_mib = 4;
  uint64_t max_mib = 1024;
  std::vector<int> levels;
  std::map<std::string, std::string> meta;
  std::vector<std::string> refs;       // --ref (repeatable)
  std::vector<std::string> ref_origs;  // --ref-original (repeatable, pairs with --ref)
  bool no_predict = false;
};

// tzip_args.cpp
Args parse_args(int argc, char** argv);
const char* help_for(const std::string& cmd);  // null for an unknown command
extern const char* const kMainHelp;

// Formatting and messages.
std::string human(double bytes);
std::string fmt(const char* f, double v);
std::string ratio_str(uint64_t raw, uint64_t comp);
double now_s();
void say(const std::string& s);  // stderr, unless -q

// Progress bar on stderr (only when it is a terminal and not -q).
class Progress {
 public:
  explicit Progress(std::string label);
  ~Progress() { finish(); }
  tc::ProgressFn fn();
  void update(uint64_t done, uint64_t total);
  void finish();

 private:
  std::string label_;
  bool enabled_ = false, drawn_ = false;
  double start_ = 0, last_ = 0;
};

// tzip_signals.cpp
void install_signals();
int pending_signal();       // the first signal received, or 0
void finish_signals();      // the command succeeded: a late signal no longer ends the process
[[noreturn]] void die_by_signal(int sig);  // default action of `sig` (after cleanup)

// tzip_stdin.cpp
// Standard input as a file the library can read (random access): the file
// itself when stdin is a regular file, else a copy spooled to an unnamed
// temporary file in $TMPDIR (gone when tzip exits, even after kill -9),
// checked as it arrives against `format` (garbage is refused at its first
// bytes; the spool holds no more than the stream's structure declares).
// Returns the path to open; messages naming it say "stdin" (display_name).
enum class StdinFormat { kSafetensors, kTzip };
std::string stdin_path(StdinFormat format);
std::string display_name(const std::string& path);  // "stdin" for stdin_path()
std::string stdin_in_message(const std::string& msg);  // the spool path replaced by "stdin"

// tzip_paths.cpp
// Output of one input: -o OUT names it, or OUT/NAME when OUT is an existing
// folder (as cp does); without -o the default name beside the input.
// "-o OUT/" that does not exist: the output folder of a folder input, an
// error for a file input.
std::string output_for(const Args& a, const std::string& in, const std::string& default_name);
// True when `out_dir` is an existing, non-empty folder holding nothing but
// what compressing (or decompressing) the folder `in_dir` writes: tzip's own
// output of it, which -o names as the output itself (replaced only with -f),
// not as a folder to write a second copy into.
bool is_output_folder_of(const std::string& in_dir, const std::string& out_dir, bool compress);
// Refuses standard output when it is a terminal.
void check_stdout_usable();
// --rm: removes an input once its output was verified against it (the
// caller verified) and is on disk (fsync'd by the library).
void remove_input(const std::string& in);
// Files of `in` (itself if it is not a folder) whose names end in `suffix`,
// top level and subfolders, in the same order as the folder commands.
std::vector<std::string> files_with_suffix(const std::string& in, const std::string& suffix);
uint64_t tree_size(const std::string& path);
// "needs" lines: which outputs need other files to decompress.
void report_dependencies(const std::vector<std::string>& tzip_files);

// Commands.
int cmd_compress(const Args& a);
int cmd_decompress(const Args& a);
int cmd_rebase(const Args& a);
int cmd_inspect(const Args& a);
int cmd_verify(const Args& a);
int cmd_bench(const Args& a);
int print_version();

}  // namespace tzip

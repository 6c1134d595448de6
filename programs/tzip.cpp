// tzip: command-line front end of the .tzip container (doc/cli.md).
// Uses only the public headers. Every failure is one line on stderr,
// "tzip: <file>: <problem>", and a documented exit status.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensorzip/container.hpp"
#include "tensorzip/tensorzip.h"

namespace tc = tz::container;
using tc::ErrorKind;

namespace {

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

int verbosity = 1;  // 0 quiet, 1 normal, 2 verbose

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

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// ---- progress bar (stderr, only when it is a terminal) ---------------------
class Progress {
 public:
  explicit Progress(std::string label) : label_(std::move(label)) {
    enabled_ = verbosity >= 1 && isatty(STDERR_FILENO);
    start_ = now_s();
  }
  ~Progress() { finish(); }
  tc::ProgressFn fn() {
    if (!enabled_) return nullptr;
    return [this](uint64_t d, uint64_t t) { update(d, t); };
  }
  void update(uint64_t done, uint64_t total) {
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
  void finish() {
    if (drawn_) {
      std::fprintf(stderr, "\r\033[K");
      std::fflush(stderr);
      drawn_ = false;
    }
  }

 private:
  std::string label_;
  bool enabled_ = false, drawn_ = false;
  double start_ = 0, last_ = 0;
};

// ---- signals: remove temporaries, then die with the signal -----------------
// First signal: ask the library to stop at the next chunk; it unwinds and
// removes its temporaries (files and folders). Second signal: remove the
// temporary files at once and die.
std::atomic<int> g_signals{0};  // lock-free, so safe in a handler
void on_signal(int sig) {
  if (g_signals.fetch_add(1) == 0) {
    tc::request_cancel();
    return;
  }
  tc::remove_temporaries_on_signal();
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);
  // Exceeding RLIMIT_FSIZE must be a write error (EFBIG), not a silent kill.
  signal(SIGXFSZ, SIG_IGN);
}

// ---- command line ----------------------------------------------------------
struct Args {
  std::string command;
  std::vector<std::string> inputs;
  std::string output;
  std::string against;
  bool force = false, json = false, help = false;
  bool have_level = false;
  int level = 0;
  unsigned threads = 0;
  unsigned block_elems = 0;
  uint64_t chunk_mib = 4;
  uint64_t max_mib = 1024;
  std::vector<int> levels;
  std::map<std::string, std::string> meta;
  std::vector<std::string> refs;  // --ref (repeatable)
  std::vector<std::string> ref_origs;  // --ref-original (repeatable, pairs with --ref)
  bool no_predict = false;
};

const char* kMainHelp =
    "tzip: lossless compression of safetensors model files and folders (tensorzip)\n"
    "\n"
    "usage: tzip COMMAND [options] ...\n"
    "\n"
    "commands:\n"
    "  compress IN... [-o OUT]    safetensors file or model folder -> .tzip (x.safetensors -> x.tzip,\n"
    "                             folder x -> folder x.tzip)\n"
    "  decompress IN... [-o OUT]  .tzip file or folder -> original bytes (x.tzip -> x.safetensors)\n"
    "  inspect FILE [--json]      tensors, dtypes, shapes, sizes and ratios\n"
    "  rebase FILE -o OUT         delta .tzip -> standalone .tzip (references resolved)\n"
    "  verify FILE|DIR [--against ORIGINAL]\n"
    "                             check every checksum; optionally compare with the original\n"
    "  bench FILE|DIR             ratio and speed of each level on your own data\n"
#ifdef TZ_HAVE_PLAN
    "  plan --params N | --checkpoint PATH\n"
    "                             time and money compression saves on checkpoints\n"
#endif
    "\n"
    "common options: -T/--threads N, -f/--force, -q/--quiet, -v/--verbose, -h/--help\n"
    "'tzip COMMAND --help' describes each command. Exit status: 0 ok, 1 usage error, 2 bad or\n"
    "corrupt input (or data differs), 3 I/O error (missing file, permission, disk full),\n"
    "4 output exists (use -f), 5 internal error, 130 interrupted (SIGINT/SIGTERM).\n";

const char* help_for(const std::string& cmd) {
  if (cmd == "compress")
    return "usage: tzip compress IN... [-o OUT] [options]\n"
           "\n"
           "Compresses safetensors files into .tzip files and Hugging Face model folders into folders\n"
           "of .tzip files (every other file -- index JSON, configs, tokenizer -- is copied byte for\n"
           "byte). Inputs are never modified. Output goes to a temporary name beside the target and is\n"
           "renamed when complete; an existing output is kept unless -f is given.\n"
           "\n"
           "  -o, --output OUT     output file or folder (default: x.safetensors -> x.tzip, folder\n"
           "                       x -> x.tzip); with several inputs, an existing folder to write into\n"
           "  -l, --level N        -1 store, 1 fast (default), 2 code every field that shrinks,\n"
           "                       3 strongest: also lane-context tables for exponents (optimizer\n"
           "                       state) and zstd 19 for non-float tensors; slower to compress\n"
           "  -T, --threads N      worker threads (default: all cores)\n"
           "      --block-elems N  elements per codec block (power of two, 4096..1048576)\n"
           "      --chunk-mib N    raw MiB per frame (power of two, default 4): bounds memory\n"
           "      --meta KEY=VALUE user metadata stored in the .tzip header (repeatable; not\n"
           "                       part of the restored safetensors file)\n"
           "      --ref PREV       previous checkpoint (delta coding): a .tzip file for one input;\n"
           "                       with several inputs or a folder, the folder holding the previous\n"
           "                       .tzip files of the same names (or one --ref per input, in order)\n"
           "      --ref-original S previous checkpoint's content as safetensors (the file it was made\n"
           "                       from, or its export): delta predictors are read from it instead of\n"
           "                       decoding --ref (faster, same output). Pairs with --ref: a file, or\n"
           "                       a folder of .safetensors files named like the inputs\n"
           "      --no-predict     plain per-tensor coding: no cast or delta prediction. By default,\n"
           "                       BF16/F16 tensors that are round-to-nearest-even casts of FP32\n"
           "                       tensors (in the same file, or in another input file given in the\n"
           "                       same command / folder) are stored as residuals when that pays\n"
           "  -f, --force          overwrite an existing output\n"
           "  -q, --quiet / -v, --verbose\n";
  if (cmd == "decompress")
    return "usage: tzip decompress IN... [-o OUT] [options]\n"
           "\n"
           "Restores the original safetensors file (byte-identical) from a .tzip file, or the original\n"
           "folder from a folder of .tzip files. Every checksum is verified on the way. Several .tzip\n"
           "files of one checkpoint (-o: an existing folder) are restored together: files others\n"
           "reference come first and serve as their predictors.\n"
           "\n"
           "  -o, --output OUT     output (default: x.tzip -> x.safetensors, folder x.tzip -> x)\n"
           "      --ref FILE       a .tzip file this one was predicted from (repeatable; matched by\n"
           "                       checksum). Default: the recorded path, relative to the file\n"
           "      --ref-original S the safetensors content of the --ref file (one per --ref): its\n"
           "                       tensors are read instead of decoding --ref (faster)\n"
           "  -T, --threads N      worker threads (default: all cores)\n"
           "  -f, --force          overwrite an existing output\n"
           "  -q, --quiet / -v, --verbose\n";
  if (cmd == "inspect")
    return "usage: tzip inspect FILE [--json]\n"
           "\n"
           "Lists the tensors of a .tzip file (or of every .tzip file in a folder): name, dtype, shape,\n"
           "original and compressed bytes, ratio, and totals. Reads only the file header.\n"
           "\n"
           "  --json               machine-readable output\n"
           "  -v, --verbose        also codec dtype, level, block size and frame count per tensor\n";
  if (cmd == "rebase")
    return "usage: tzip rebase FILE.tzip -o OUT.tzip [options]\n"
           "\n"
           "Writes a standalone copy of a .tzip file that was compressed against other .tzip files\n"
           "(--ref delta, or cast sources in another file): OUT needs no other file to decompress.\n"
           "Casts within the file are kept (--no-predict drops them too).\n"
           "\n"
           "  -o, --output OUT     output .tzip (required)\n"
           "      --ref FILE       location of a referenced .tzip (repeatable; default: recorded path)\n"
           "      --no-predict     no prediction at all in OUT\n"
           "  -T, --threads N      worker threads (default: all cores)\n"
           "  -f, --force          overwrite an existing output\n";
  if (cmd == "verify")
    return "usage: tzip verify FILE|DIR [--against ORIGINAL] [options]\n"
           "\n"
           "Checks the whole-file checksum, the header, every frame checksum and every block checksum\n"
           "of a .tzip file (or of every .tzip file in a folder). With --against, also decompresses\n"
           "in memory and compares with the original file (or folder) byte for byte.\n"
           "\n"
           "  --against ORIGINAL   the original safetensors file or model folder\n"
           "  -T, --threads N      worker threads (default: all cores)\n"
           "  -q, --quiet / -v, --verbose\n";
  if (cmd == "bench")
    return "usage: tzip bench FILE|DIR [options]\n"
           "\n"
           "Measures ratio and in-memory compress/decompress speed of each level on the tensors of a\n"
           "safetensors file (or the safetensors files of a folder), per dtype and overall. Loads at\n"
           "most --max-mib of tensor data.\n"
           "\n"
           "  -T, --threads N      worker threads (default: all cores)\n"
           "      --levels LIST    comma-separated levels (default -1,1,2,3)\n"
           "      --max-mib N      data to load (default 1024)\n";
  return nullptr;
}

uint64_t parse_uint(const std::string& opt, const std::string& v, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end || errno || v[0] == '-' || x < lo || x > hi)
    throw UsageError("option " + opt + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got '" + v + "'");
  return x;
}

int parse_level(const std::string& opt, const std::string& v) {
  if (v == "-1") return -1;
  return (int)parse_uint(opt, v, 0, 3);
}

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) throw UsageError("missing command (try 'tzip --help')");
  a.command = argv[1];
  if (a.command == "-h" || a.command == "--help" || a.command == "help") {
    a.help = true;
    a.command.clear();
    return a;
  }
  if (a.command == "-V" || a.command == "--version") return a;
  if (!help_for(a.command)) throw UsageError("unknown command '" + a.command + "' (try 'tzip --help')");
  bool only_pos = false;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (only_pos || s.empty() || s[0] != '-' || s == "-") {
      a.inputs.push_back(s);
      continue;
    }
    if (s == "--") {
      only_pos = true;
      continue;
    }
    std::string val;
    bool has_eq = false;
    if (s.rfind("--", 0) == 0) {
      const auto eq = s.find('=');
      if (eq != std::string::npos) {
        val = s.substr(eq + 1);
        s = s.substr(0, eq);
        has_eq = true;
      }
    } else if (s.size() > 2) {
      // -T4, -l2, -o out: short option with an attached value
      val = s.substr(2);
      s = s.substr(0, 2);
      has_eq = true;
    }
    auto value = [&]() -> std::string {
      if (has_eq) return val;
      if (i + 1 >= argc) throw UsageError("option " + s + " needs a value");
      return argv[++i];
    };
    auto flag = [&] {
      if (has_eq) throw UsageError("option " + s + " takes no value");
    };
    if (s == "-h" || s == "--help") flag(), a.help = true;
    else if (s == "-f" || s == "--force") flag(), a.force = true;
    else if (s == "-q" || s == "--quiet") flag(), verbosity = 0;
    else if (s == "-v" || s == "--verbose") flag(), verbosity = 2;
    else if (s == "--json" && a.command == "inspect") flag(), a.json = true;
    else if (s == "-o" || s == "--output") a.output = value();
    else if (s == "-T" || s == "--threads") a.threads = (unsigned)parse_uint(s, value(), 1, 4096);
    else if ((s == "-l" || s == "--level") && a.command == "compress") a.level = parse_level(s, value()), a.have_level = true;
    else if (s == "--block-elems" && a.command == "compress") a.block_elems = (unsigned)parse_uint(s, value(), 4096, 1u << 20);
    else if (s == "--chunk-mib" && a.command == "compress") a.chunk_mib = parse_uint(s, value(), 1, 64);
    else if (s == "--against" && a.command == "verify") a.against = value();
    else if (s == "--ref" && (a.command == "compress" || a.command == "decompress" || a.command == "verify" ||
                              a.command == "rebase"))
      a.refs.push_back(value());
    else if (s == "--ref-original" && (a.command == "compress" || a.command == "decompress"))
      a.ref_origs.push_back(value());
    else if (s == "--no-predict" && (a.command == "compress" || a.command == "rebase")) flag(), a.no_predict = true;
    else if (s == "--meta" && a.command == "compress") {
      const std::string kv = value();
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) throw UsageError("--meta needs KEY=VALUE, got '" + kv + "'");
      a.meta[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    else if (s == "--max-mib" && a.command == "bench") a.max_mib = parse_uint(s, value(), 1, 1u << 30);
    else if (s == "--levels" && a.command == "bench") {
      std::string l = value();
      size_t p = 0;
      while (p <= l.size()) {
        const size_t q = std::min(l.find(',', p), l.size());
        a.levels.push_back(parse_level(s, l.substr(p, q - p)));
        p = q + 1;
      }
    } else {
      throw UsageError("unknown option '" + s + "' for '" + a.command + "' (try 'tzip " + a.command + " --help')");
    }
  }
  return a;
}

// ---- commands --------------------------------------------------------------
void say(const std::string& s) {
  if (verbosity >= 1) std::fprintf(stderr, "%s\n", s.c_str());
}

std::string ratio_str(uint64_t raw, uint64_t comp) { return comp ? fmt("%.3f", (double)raw / comp) : "-"; }

uint64_t tree_size(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return (uint64_t)st.st_size;
  uint64_t s = 0;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") s += tree_size(path + "/" + n);
    }
    closedir(d);
  }
  return s;
}

int cmd_compress(const Args& a) {
  if (a.inputs.empty()) throw UsageError("compress: no input given (try 'tzip compress --help')");
  const bool many = a.inputs.size() > 1;
  if (many && !a.output.empty() && tc::path_kind(a.output) != tc::PathKind::kDir)
    throw UsageError("-o must be an existing folder when several inputs are given");
  if (a.output == "-") throw UsageError("writing to standard output is not supported; give a file name");
  tc::WriteOptions o;
  o.level = a.level;
  o.threads = a.threads;
  o.block_elems = a.block_elems;
  o.force = a.force;
  o.chunk_bytes = a.chunk_mib << 20;
  o.user_metadata = a.meta;
  o.predict = !a.no_predict;
  if ((a.chunk_mib & (a.chunk_mib - 1)) != 0) throw UsageError("--chunk-mib must be a power of two");
  if (verbosity >= 2)
    std::fprintf(stderr, "tzip: level %s, %u threads, %" PRIu64 " MiB chunks, block %s elements\n",
                 a.level == 0 ? "default (1)" : std::to_string(a.level).c_str(),
                 a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency()), a.chunk_mib,
                 a.block_elems ? std::to_string(a.block_elems).c_str() : "default");
  auto out_name = [&](const std::string& in, bool dir) {
    std::string out = tc::default_compressed_name(in, dir);
    if (!a.output.empty()) {
      if (many) {
        std::string base = out.substr(out.find_last_of('/') == std::string::npos ? 0 : out.find_last_of('/') + 1);
        out = a.output + "/" + base;
      } else {
        out = a.output;
      }
    }
    return out;
  };
  auto base_name = [](const std::string& p) {
    const auto k = p.find_last_of('/');
    return k == std::string::npos ? p : p.substr(k + 1);
  };
  bool all_files = true;
  for (const auto& in : a.inputs) all_files = all_files && tc::path_kind(in) == tc::PathKind::kFile;
  if (a.refs.size() > 1 && a.refs.size() != a.inputs.size())
    throw UsageError("--ref: give one previous checkpoint per input, or one (a file, or a folder of .tzip files)");
  if (!a.ref_origs.empty() && a.ref_origs.size() != a.refs.size())
    throw UsageError("--ref-original: give one per --ref (the previous checkpoint's safetensors content)");
  // Several safetensors files: one checkpoint, compressed together so that
  // casts across files are found (doc/container.md section 12).
  if (many && all_files) {
    std::vector<std::string> outs, refs, ref_origs;
    for (size_t i = 0; i < a.inputs.size(); ++i) {
      outs.push_back(out_name(a.inputs[i], false));
      if (a.refs.size() == a.inputs.size()) {
        refs.push_back(a.refs[i]);
        if (!a.ref_origs.empty()) ref_origs.push_back(a.ref_origs[i]);
      } else if (a.refs.size() == 1) {
        if (tc::path_kind(a.refs[0]) != tc::PathKind::kDir)
          throw UsageError("--ref: with several inputs, give a folder of .tzip files or one --ref per input");
        const std::string r = a.refs[0] + "/" + base_name(outs.back());
        refs.push_back(tc::path_kind(r) == tc::PathKind::kFile ? r : std::string());
        if (!a.ref_origs.empty()) {
          if (tc::path_kind(a.ref_origs[0]) != tc::PathKind::kDir)
            throw UsageError("--ref-original: with a --ref folder, give a folder of .safetensors files");
          const std::string ro = a.ref_origs[0] + "/" + base_name(a.inputs[i]);
          ref_origs.push_back(!refs.back().empty() && tc::path_kind(ro) == tc::PathKind::kFile ? ro : std::string());
        }
      }
    }
    Progress bar("checkpoint");
    o.progress = bar.fn();
    const double t0 = now_s();
    const tc::PassStats st = tc::compress_checkpoint(a.inputs, outs, o, refs, ref_origs);
    const double el = now_s() - t0;
    bar.finish();
    for (size_t i = 0; i < outs.size(); ++i) say(a.inputs[i] + " -> " + outs[i]);
    say("checkpoint: " + human(st.raw_bytes) + " -> " + human(st.file_bytes) + " (ratio " +
        ratio_str(st.raw_bytes, st.file_bytes) + ", " + human(st.raw_bytes / std::max(el, 1e-9)) + "/s)");
    return kExitOk;
  }
  for (size_t ii = 0; ii < a.inputs.size(); ++ii) {
    const std::string& in = a.inputs[ii];
    const tc::PathKind k = tc::path_kind(in);
    if (k == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file or folder");
    if (k == tc::PathKind::kOther) throw tc::Error(ErrorKind::kUsage, in + ": not a regular file or folder");
    const bool dir = k == tc::PathKind::kDir;
    const std::string out = out_name(in, dir);
    o.ref = a.refs.size() == a.inputs.size() ? a.refs[ii] : a.refs.size() == 1 ? a.refs[0] : std::string();
    o.ref_original = a.ref_origs.size() == a.inputs.size() ? a.ref_origs[ii]
                     : a.ref_origs.size() == 1                 ? a.ref_origs[0]
                                                               : std::string();
    Progress bar(in);
    o.progress = bar.fn();
    const double t0 = now_s();
    uint64_t raw, comp;
    if (dir) {
      tc::compress_folder(in, out, o);
      raw = tree_size(in);
      comp = tree_size(out);
    } else {
      const tc::PassStats st = tc::compress_file(in, out, o);
      raw = st.raw_bytes;
      comp = st.file_bytes;
    }
    const double el = now_s() - t0;
    bar.finish();
    say(in + " -> " + out + ": " + human(raw) + " -> " + human(comp) + " (ratio " + ratio_str(raw, comp) + ", " +
        human(raw / std::max(el, 1e-9)) + "/s)");
  }
  return kExitOk;
}

int cmd_decompress(const Args& a) {
  if (a.inputs.empty()) throw UsageError("decompress: no input given (try 'tzip decompress --help')");
  if (a.inputs.size() > 1) {
    // Several .tzip files of one checkpoint: referenced files first, and
    // their restored bytes serve as predictors (master weights decoded once).
    if (a.output.empty() || tc::path_kind(a.output) != tc::PathKind::kDir)
      throw UsageError("-o must be an existing folder when several inputs are given");
    std::vector<std::string> outs;
    for (const auto& in : a.inputs) {
      if (tc::path_kind(in) != tc::PathKind::kFile) throw tc::Error(ErrorKind::kIO, in + ": no such .tzip file");
      std::string o = tc::default_decompressed_name(in, false);
      if (o.empty()) throw UsageError(in + ": name does not end in .tzip");
      const auto k = o.find_last_of('/');
      outs.push_back(a.output + "/" + (k == std::string::npos ? o : o.substr(k + 1)));
    }
    tc::ReadOptions o;
    o.threads = a.threads;
    o.force = a.force;
    o.refs = a.refs;
    o.ref_originals = a.ref_origs;
    const double t0 = now_s();
    const tc::PassStats st = tc::decompress_checkpoint(a.inputs, outs, o);
    const double el = now_s() - t0;
    say("checkpoint: " + human(st.file_bytes) + " -> " + human(st.raw_bytes) + " (" +
        human(st.raw_bytes / std::max(el, 1e-9)) + "/s)");
    return kExitOk;
  }
  const std::string& in = a.inputs[0];
  const tc::PathKind k = tc::path_kind(in);
  if (k == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file or folder");
  if (k == tc::PathKind::kOther) throw tc::Error(ErrorKind::kUsage, in + ": not a regular file or folder");
  const bool dir = k == tc::PathKind::kDir;
  std::string out = a.output.empty() ? tc::default_decompressed_name(in, dir) : a.output;
  if (out.empty()) throw UsageError(in + ": name does not end in .tzip; give the output name with -o");
  if (out == "-") throw UsageError("writing to standard output is not supported; give a file name");
  tc::ReadOptions o;
  o.threads = a.threads;
  o.force = a.force;
  o.refs = a.refs;
  o.ref_originals = a.ref_origs;
  Progress bar(in);
  o.progress = bar.fn();
  const double t0 = now_s();
  uint64_t raw, comp;
  if (dir) {
    if (!a.refs.empty()) throw UsageError("--ref applies to a single .tzip file (a folder uses its recorded paths)");
    tc::decompress_folder(in, out, o);
    raw = tree_size(out);
    comp = tree_size(in);
  } else {
    tc::Reader r(in, a.threads);
    const tc::PassStats st = r.export_safetensors(out, o);
    raw = st.raw_bytes;
    comp = st.file_bytes;
  }
  const double el = now_s() - t0;
  bar.finish();
  say(in + " -> " + out + ": " + human(comp) + " -> " + human(raw) + " (" + human(raw / std::max(el, 1e-9)) + "/s)");
  return kExitOk;
}

// Files of `in` (itself if it is not a folder) whose names end in `suffix`,
// top level and subfolders, in the same order as the folder commands.
std::vector<std::string> files_with_suffix(const std::string& in, const std::string& suffix) {
  if (tc::path_kind(in) != tc::PathKind::kDir) return {in};
  std::vector<std::string> v, stack{in};
  while (!stack.empty()) {
    const std::string d = stack.back();
    stack.pop_back();
    std::vector<std::string> names;
    if (auto* dp = opendir(d.c_str())) {
      while (auto* e = readdir(dp)) names.push_back(e->d_name);
      closedir(dp);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
      if (n == "." || n == "..") continue;
      const std::string p = d + "/" + n;
      if (tc::path_kind(p) == tc::PathKind::kDir) stack.push_back(p);
      else if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
        v.push_back(p);
    }
  }
  return v;
}

std::vector<std::string> tzip_files_of(const std::string& in) { return files_with_suffix(in, ".tzip"); }

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int cmd_inspect(const Args& a) {
  if (a.inputs.size() != 1) throw UsageError("inspect: give exactly one file (try 'tzip inspect --help')");
  const tc::PathKind k = tc::path_kind(a.inputs[0]);
  if (k == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, a.inputs[0] + ": no such file or folder");
  nlohmann::json all = nlohmann::json::array();
  for (const auto& path : tzip_files_of(a.inputs[0])) {
    tc::Reader r(path, 1);
    uint64_t raw = 0, comp = 0;
    std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;
    for (const auto& t : r.tensors()) {
      raw += t.raw_size();
      comp += t.compressed_size();
      by_dtype[t.dtype].first += t.raw_size();
      by_dtype[t.dtype].second += t.compressed_size();
    }
    uint64_t gap_raw = 0, gap_comp = 0;
    for (const auto& g : r.gaps()) gap_raw += g.raw_size(), gap_comp += g.compressed_size();
    if (a.json) {
      nlohmann::json j;
      j["file"] = path;
      j["file_size"] = r.file_size();
      j["original_size"] = r.original_size();
      j["created_by"] = r.created_by();
      j["metadata"] = r.metadata();
      j["user_metadata"] = r.user_metadata();
      j["chunk_bytes"] = r.chunk_bytes();
      j["format_version"] = std::to_string(r.version_major()) + "." + std::to_string(r.version_minor());
      nlohmann::json refs = nlohmann::json::array();
      for (const auto& rf : r.references()) {
        char hx[17];
        std::snprintf(hx, sizeof hx, "%016" PRIx64, rf.xxh64);
        refs.push_back({{"file", rf.file}, {"xxh64", hx}});
      }
      j["references"] = refs;
      nlohmann::json ts = nlohmann::json::array();
      for (const auto& t : r.tensors()) {
        nlohmann::json e = {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"size", t.raw_size()},
                            {"compressed_size", t.compressed_size()}, {"codec_dtype", tz_dtype_name(t.codec_dtype)},
                            {"level", t.level}, {"block_elems", t.block_elems}, {"frames", t.frames.size()}};
        if (t.predict.kind != tc::PredictKind::kNone) {
          nlohmann::json p = {{"kind", t.predict.kind == tc::PredictKind::kCast ? "cast" : "delta"}};
          p["source"] = t.predict.kind == tc::PredictKind::kCast ? t.predict.source : t.name;
          p["file"] = t.predict.ref < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.references()[t.predict.ref].file);
          e["predict"] = p;
        }
        ts.push_back(e);
      }
      j["tensors"] = ts;
      j["gaps"] = {{"count", r.gaps().size()}, {"size", gap_raw}, {"compressed_size", gap_comp}};
      j["ratio"] = r.file_size() ? (double)r.original_size() / r.file_size() : 0.0;
      all.push_back(j);
      continue;
    }
    std::printf("%s: %zu tensors, %s original, %s compressed, ratio %s (%s)\n", path.c_str(), r.tensors().size(),
                human(r.original_size()).c_str(), human(r.file_size()).c_str(),
                ratio_str(r.original_size(), r.file_size()).c_str(), r.created_by().c_str());
    size_t w = 4;
    for (const auto& t : r.tensors()) w = std::max(w, t.name.size());
    w = std::min<size_t>(w, 60);
    std::printf("  %-*s  %-7s  %-20s  %12s  %12s  %6s%s  %s\n", (int)w, "name", "dtype", "shape", "bytes", "compressed",
                "ratio", verbosity >= 2 ? "  codec    level  block  frames" : "", "predicted from");
    for (const auto& t : r.tensors()) {
      std::printf("  %-*s  %-7s  %-20s  %12" PRIu64 "  %12" PRIu64 "  %6s", (int)w, t.name.c_str(), t.dtype.c_str(),
                  shape_str(t.shape).c_str(), t.raw_size(), t.compressed_size(),
                  ratio_str(t.raw_size(), t.compressed_size()).c_str());
      if (verbosity >= 2)
        std::printf("  %-7s  %5d  %5u  %6zu", tz_dtype_name(t.codec_dtype), t.level, t.block_elems, t.frames.size());
      if (t.predict.kind == tc::PredictKind::kCast)
        std::printf("  cast of %s%s", t.predict.source.c_str(),
                    t.predict.ref < 0 ? " (this file)" : (" in " + r.references()[t.predict.ref].file).c_str());
      else if (t.predict.kind == tc::PredictKind::kDelta)
        std::printf("  delta vs %s", r.references()[t.predict.ref].file.c_str());
      std::printf("\n");
    }
    for (const auto& [dt, s] : by_dtype)
      std::printf("  total %-7s %s -> %s, ratio %s\n", dt.c_str(), human(s.first).c_str(), human(s.second).c_str(),
                  ratio_str(s.first, s.second).c_str());
    for (const auto& [k, v] : r.user_metadata()) std::printf("  user metadata: %s = %s\n", k.c_str(), v.c_str());
    for (const auto& rf : r.references())
      std::printf("  needs reference: %s (xxh64 %016" PRIx64 ")\n", rf.file.c_str(), rf.xxh64);
    if (r.version_major() >= 2) {
      size_t nc = 0, nd = 0;
      for (const auto& t : r.tensors())
        nc += t.predict.kind == tc::PredictKind::kCast, nd += t.predict.kind == tc::PredictKind::kDelta;
      std::printf("  predicted tensors: %zu cast, %zu delta (format version %u.%u)\n", nc, nd, r.version_major(),
                  r.version_minor());
    }
    if (!r.gaps().empty())
      std::printf("  gaps: %zu, %" PRIu64 " bytes (kept for a byte-identical export)\n", r.gaps().size(), gap_raw);
    std::printf("  total: tensors %s -> %s (ratio %s); file %s -> %s (ratio %s)\n", human(raw).c_str(),
                human(comp).c_str(), ratio_str(raw, comp).c_str(), human(r.original_size()).c_str(),
                human(r.file_size()).c_str(), ratio_str(r.original_size(), r.file_size()).c_str());
  }
  if (a.json) std::printf("%s\n", (all.size() == 1 ? all[0] : all).dump(2).c_str());
  return kExitOk;
}

int cmd_rebase(const Args& a) {
  if (a.inputs.size() != 1) throw UsageError("rebase: give exactly one .tzip file (try 'tzip rebase --help')");
  if (a.output.empty()) throw UsageError("rebase: give the output with -o");
  const std::string& in = a.inputs[0];
  if (tc::path_kind(in) == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file");
  if (tc::path_kind(in) != tc::PathKind::kFile) throw tc::Error(ErrorKind::kUsage, in + ": not a .tzip file");
  tc::WriteOptions w;
  w.threads = a.threads;
  w.force = a.force;
  w.predict = !a.no_predict;
  {
    tc::Reader r(in, 1);
    if (!r.tensors().empty()) {
      w.level = r.tensors()[0].level;
      w.chunk_bytes = r.chunk_bytes();
    }
    w.user_metadata = r.user_metadata();
  }
  tc::ReadOptions ro;
  ro.threads = a.threads;
  ro.refs = a.refs;
  const double t0 = now_s();
  const tc::PassStats st = tc::rebase(in, a.output, w, ro);
  say(in + " -> " + a.output + " (standalone): " + human(st.raw_bytes) + " -> " + human(st.file_bytes) + " (ratio " +
      ratio_str(st.raw_bytes, st.file_bytes) + ", " + fmt("%.2f s", now_s() - t0) + ")");
  return kExitOk;
}

int cmd_verify(const Args& a) {
  if (a.inputs.size() != 1) throw UsageError("verify: give exactly one file or folder (try 'tzip verify --help')");
  const std::string& in = a.inputs[0];
  const tc::PathKind k = tc::path_kind(in);
  if (k == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file or folder");
  if (!a.against.empty() && tc::path_kind(a.against) == tc::PathKind::kMissing)
    throw tc::Error(ErrorKind::kIO, a.against + ": no such file or folder");
  tc::ReadOptions o;
  o.threads = a.threads;
  o.refs = a.refs;
  Progress bar(in);
  o.progress = bar.fn();
  if (k == tc::PathKind::kDir) {
    if (!a.refs.empty()) throw UsageError("--ref applies to a single .tzip file (a folder uses its recorded paths)");
    tc::verify_folder(in, a.against, o);
  } else {
    if (!a.against.empty() && tc::path_kind(a.against) == tc::PathKind::kDir)
      throw tc::Error(ErrorKind::kUsage, a.against + ": is a folder, expected the original file");
    tc::Reader r(in, a.threads);
    r.verify(a.against, o);
  }
  bar.finish();
  say(in + ": OK" + (a.against.empty() ? std::string(" (all checksums verified)") : ", identical to " + a.against));
  return kExitOk;
}

// ---- bench -----------------------------------------------------------------
struct BenchUnit {
  std::string dtype;
  tz_dtype codec;
  std::vector<uint8_t> raw;
  std::vector<uint8_t> comp;
  size_t comp_size = 0;
};

std::vector<std::string> safetensors_files_of(const std::string& in) { return files_with_suffix(in, ".safetensors"); }

template <class F>
double parallel_time(size_t n, unsigned threads, F&& f) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const double t0 = now_s();
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      for (size_t i; (i = next++) < n;)
        if (!f(i, w)) failed = true;
    });
  for (auto& t : pool) t.join();
  if (failed) throw tc::Error(ErrorKind::kInternal, "bench: codec failure");
  return now_s() - t0;
}

int cmd_bench(const Args& a) {
  if (a.inputs.size() != 1) throw UsageError("bench: give exactly one file or folder (try 'tzip bench --help')");
  const std::string& in = a.inputs[0];
  if (tc::path_kind(in) == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file or folder");
  const unsigned threads = a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency());
  const uint64_t cap = a.max_mib << 20, chunk = 4u << 20;
  std::vector<BenchUnit> units;
  uint64_t loaded = 0;
  const auto files = safetensors_files_of(in);
  if (files.empty()) throw tc::Error(ErrorKind::kUsage, in + ": no .safetensors files found");
  for (const auto& f : files) {
    const tc::SafetensorsInfo st = tc::read_safetensors_info(f);
    FILE* fp = std::fopen(f.c_str(), "rb");
    if (!fp) throw tc::Error(ErrorKind::kIO, f + ": cannot open: " + std::strerror(errno));
    std::unique_ptr<FILE, int (*)(FILE*)> guard(fp, &std::fclose);
    for (const auto& t : st.tensors) {
      for (uint64_t off = 0; off < t.raw_size() && loaded < cap; off += chunk) {
        BenchUnit u;
        u.dtype = t.dtype;
        u.codec = t.codec_dtype;
        u.raw.resize(std::min(chunk, t.raw_size() - off));
        if (fseeko(fp, (off_t)(st.data_start + t.data_begin + off), SEEK_SET) != 0 ||
            std::fread(u.raw.data(), 1, u.raw.size(), fp) != u.raw.size())
          throw tc::Error(ErrorKind::kIO, f + ": read failed");
        u.comp.resize(tz_compress_bound(u.raw.size()));
        loaded += u.raw.size();
        units.push_back(std::move(u));
      }
    }
  }
  if (loaded == 0) throw tc::Error(ErrorKind::kUsage, in + ": no tensor data");
  std::vector<std::string> dtypes;
  for (const auto& u : units)
    if (std::find(dtypes.begin(), dtypes.end(), u.dtype) == dtypes.end()) dtypes.push_back(u.dtype);
  std::printf("tzip bench: %s, %zu file(s), %s of tensor data in %zu chunks, %u thread(s)\n", in.c_str(), files.size(),
              human(loaded).c_str(), units.size(), threads);
  std::printf("%-6s %8s", "level", "ratio");
  for (const auto& d : dtypes) std::printf(" %9s", (d + " ratio").substr(0, 9).c_str());
  std::printf(" %12s %12s\n", "comp GB/s", "decomp GB/s");
  std::vector<tz_ctx*> ctx;
  for (unsigned w = 0; w < threads; ++w) ctx.push_back(tz_ctx_create(1));
  std::vector<std::vector<uint8_t>> scratch(threads, std::vector<uint8_t>(chunk));
  const std::vector<int> levels = a.levels.empty() ? std::vector<int>{-1, 1, 2, 3} : a.levels;
  for (int level : levels) {
    const double tc_ = parallel_time(units.size(), threads, [&](size_t i, unsigned w) {
      tz_params p{};
      p.dtype = units[i].codec;
      p.level = level;
      p.threads = 1;
      const size_t r = tz_ctx_compress(ctx[w], units[i].comp.data(), units[i].comp.size(), units[i].raw.data(),
                                       units[i].raw.size(), &p);
      units[i].comp_size = r;
      return !tz_is_error(r);
    });
    const double td = parallel_time(units.size(), threads, [&](size_t i, unsigned w) {
      const size_t r = tz_ctx_decompress(ctx[w], scratch[w].data(), scratch[w].size(), units[i].comp.data(),
                                         units[i].comp_size);
      return !tz_is_error(r) && r == units[i].raw.size() &&
             std::memcmp(scratch[w].data(), units[i].raw.data(), r) == 0;
    });
    uint64_t comp = 0;
    std::map<std::string, std::pair<uint64_t, uint64_t>> by;
    for (const auto& u : units) {
      comp += u.comp_size;
      by[u.dtype].first += u.raw.size();
      by[u.dtype].second += u.comp_size;
    }
    std::printf("%-6d %8s", level, ratio_str(loaded, comp).c_str());
    for (const auto& d : dtypes) std::printf(" %9s", ratio_str(by[d].first, by[d].second).c_str());
    std::printf(" %12.2f %12.2f\n", loaded / tc_ / 1e9, loaded / td / 1e9);
    std::fflush(stdout);
  }
  for (auto* c : ctx) tz_ctx_free(c);
  return kExitOk;
}

}  // namespace

#ifdef TZ_HAVE_PLAN
int tzip_plan_main(int argc, char** argv);  // programs/tzip_plan.cpp
#endif

int main(int argc, char** argv) {
#ifdef TZ_HAVE_PLAN
  if (argc >= 2 && std::string(argv[1]) == "plan") return tzip_plan_main(argc - 1, argv + 1);
#endif
  install_signals();
  Args a;
  try {
    a = parse_args(argc, argv);
    if (a.command == "-V" || a.command == "--version") {
      std::printf("tzip %d.%d.%d (container format %d.%d, frame format %d, CPU kernels: %s)\n", TZ_VERSION_MAJOR,
                  TZ_VERSION_MINOR, TZ_VERSION_PATCH, tc::kTzipVersionMajor, tc::kTzipVersionMinor,
                  TZ_FORMAT_VERSION, tz_simd_path());
      return kExitOk;
    }
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
    std::fprintf(stderr, "tzip: %s\n", e.what());
    return kExitUsage;
  } catch (const tc::Error& e) {
    std::fprintf(stderr, "tzip: %s\n", e.what());
    switch (e.kind()) {
      case ErrorKind::kUsage: return kExitUsage;
      case ErrorKind::kBadInput: return kExitBadInput;
      case ErrorKind::kIO: return kExitIO;
      case ErrorKind::kExists: return kExitExists;
      case ErrorKind::kInterrupted: return kExitSignal;
      default: return kExitInternal;
    }
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tzip: out of memory\n");
    return kExitInternal;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tzip: internal error: %s\n", e.what());
    return kExitInternal;
  }
}

// tzip command line: options, bundled short flags (-qv, -fT4, -3), help texts.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "tzip_cli.hpp"

namespace tzip {

const char* const kMainHelp =
    "tzip: lossless compression of safetensors model files and folders (tensorzip)\n"
    "\n"
    "usage: tzip COMMAND [options] ...\n"
    "\n"
    "commands:\n"
    "  compress IN... [-o OUT]    safetensors file or model folder -> .tzip (x.safetensors -> x.tzip,\n"
    "                             folder x -> folder x.tzip); '-': standard input\n"
    "  decompress IN... [-o OUT]  .tzip file or folder -> original bytes (x.tzip -> x.safetensors)\n"
    "  inspect IN... [--json]     tensors, dtypes, shapes, sizes and ratios\n"
    "  verify IN... [--against ORIGINAL]\n"
    "                             check every checksum; optionally compare with the original\n"
    "  rebase IN... -o OUT        delta .tzip -> standalone .tzip (references resolved)\n"
    "  bench IN...                ratio and speed of each level on your own data\n"
#ifdef TZ_HAVE_PLAN
    "  plan --params N | --checkpoint PATH\n"
    "                             time and money compression saves on checkpoints\n"
#endif
    "\n"
    "common options: -T/--threads N (0: all cores), -f/--force, -c/--stdout, -k/--keep, --rm,\n"
    "-q/--quiet, -v/--verbose, -h/--help, -V/--version; short flags bundle (-qf, -T4, -3).\n"
    "'tzip COMMAND --help' describes each command. Exit status: 0 ok, 1 usage error, 2 bad or\n"
    "corrupt input (or data differs), 3 I/O error (missing file, permission, disk full),\n"
    "4 output exists (use -f), 5 internal error; killed by SIGINT/SIGTERM/SIGHUP after removing\n"
    "its temporaries (shell status 130/143/129).\n";

const char* help_for(const std::string& cmd) {
  if (cmd == "compress")
    return "usage: tzip compress IN... [-o OUT] [options]\n"
           "\n"
           "Compresses safetensors files into .tzip files and Hugging Face model folders into folders\n"
           "of .tzip files (every other file -- index JSON, configs, tokenizer -- is copied byte for\n"
           "byte). Inputs are kept (unless --rm). Output goes to a temporary name beside the target\n"
           "and is renamed when complete, with the input's permission bits and times; an existing\n"
           "output is kept unless -f is given.\n"
           "\n"
           "  -o, --output OUT     output file or folder (default: x.safetensors -> x.tzip, folder\n"
           "                       x -> x.tzip); an existing folder is a folder to write into\n"
           "  -c, --stdout         write the .tzip to standard output (one file input; also -o -)\n"
           "  IN = -               read the safetensors file from standard input (spooled to an\n"
           "                       unnamed temporary file; output: standard output unless -o)\n"
           "  -l, --level N        -1 store, 1 fast (default), 2 code every field that shrinks,\n"
           "                       3 strongest: also lane-context tables for exponents (optimizer\n"
           "                       state) and zstd 19 for non-float tensors; slower to compress\n"
           "  -1, -2, -3           the same as -l 1, -l 2, -l 3\n"
           "  -T, --threads N      worker threads (0 or default: all cores)\n"
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
           "      --independent    no output needs another output: casts only within a file (the\n"
           "                       summary says when an output needs another one)\n"
           "  -f, --force          replace an existing output (a regular file, or a folder holding\n"
           "                       only what this output holds)\n"
           "  -k, --keep / --rm    keep the inputs (default) / remove each input file once its output\n"
           "                       is verified against it and on disk\n"
           "  -q, --quiet / -v, --verbose\n";
  if (cmd == "decompress")
    return "usage: tzip decompress IN... [-o OUT] [options]\n"
           "\n"
           "Restores the original safetensors file (byte-identical) from a .tzip file, or the original\n"
           "folder from a folder of .tzip files. Every checksum is verified on the way. Several .tzip\n"
           "files are restored together (all or nothing): files others reference come first and serve\n"
           "as their predictors. Without -o each output goes beside its input.\n"
           "\n"
           "  -o, --output OUT     output (default: x.tzip -> x.safetensors, folder x.tzip -> x); an\n"
           "                       existing folder is a folder to write into\n"
           "  -c, --stdout         write the safetensors file to standard output (also -o -)\n"
           "  IN = -               read the .tzip from standard input (spooled to an unnamed\n"
           "                       temporary file; output: standard output unless -o)\n"
           "      --ref FILE       a .tzip file this one was predicted from (repeatable; matched by\n"
           "                       checksum). Default: the recorded path, relative to the file\n"
           "      --ref-original S the safetensors content of the --ref file (one per --ref): its\n"
           "                       tensors are read instead of decoding --ref (faster)\n"
           "  -T, --threads N      worker threads (0 or default: all cores)\n"
           "  -f, --force          replace an existing output\n"
           "  -k, --keep / --rm    keep the inputs (default) / remove each input file once its output\n"
           "                       is verified and on disk\n"
           "  -q, --quiet / -v, --verbose\n";
  if (cmd == "inspect")
    return "usage: tzip inspect IN... [--json]\n"
           "\n"
           "Lists the tensors of .tzip files (a folder: every .tzip file in it): name, dtype, shape,\n"
           "original and compressed bytes, ratio, and totals. Reads only the file header.\n"
           "\n"
           "  --json               machine-readable output (an array for several files)\n"
           "  -v, --verbose        also codec dtype, level, block size and frame count per tensor\n";
  if (cmd == "rebase")
    return "usage: tzip rebase IN... -o OUT [options]\n"
           "\n"
           "Writes a standalone copy of a .tzip file that was compressed against other .tzip files\n"
           "(--ref delta, or cast sources in another file): OUT needs no other file to decompress.\n"
           "Casts within the file are kept (--no-predict drops them too). Several inputs: OUT is an\n"
           "existing folder.\n"
           "\n"
           "  -o, --output OUT     output .tzip, or an existing folder (required)\n"
           "      --ref FILE       location of a referenced .tzip (repeatable; default: recorded path)\n"
           "      --no-predict     no prediction at all in OUT\n"
           "  -T, --threads N      worker threads (0 or default: all cores)\n"
           "  -f, --force          replace an existing output\n";
  if (cmd == "verify")
    return "usage: tzip verify IN... [--against ORIGINAL] [options]\n"
           "\n"
           "Checks the whole-file checksum, the header, every frame checksum and every block checksum\n"
           "of .tzip files (a folder: every .tzip file in it). With --against (one input), also\n"
           "decompresses in memory and compares with the original file (or folder) byte for byte.\n"
           "Every input is checked; the exit status is that of the first failure.\n"
           "\n"
           "  --against ORIGINAL   the original safetensors file or model folder\n"
           "  -T, --threads N      worker threads (0 or default: all cores)\n"
           "  -q, --quiet / -v, --verbose\n";
  if (cmd == "bench")
    return "usage: tzip bench IN... [options]\n"
           "\n"
           "Measures ratio and in-memory compress/decompress speed of each level on the tensors of\n"
           "safetensors files (a folder: its safetensors files), per dtype and overall. Loads at\n"
           "most --max-mib of tensor data.\n"
           "\n"
           "  -T, --threads N      worker threads (0 or default: all cores)\n"
           "      --levels LIST    comma-separated levels (default -1,1,2,3)\n"
           "      --max-mib N      data to load (default 1024)\n";
  return nullptr;
}

namespace {

uint64_t parse_uint(const std::string& opt, const std::string& v, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end || errno || v[0] == '-' || x < lo || x > hi)
    throw UsageError("option " + opt + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got '" + v + "'");
  return x;
}

// An option value checked by the library's writer rule (tc::check_*).
template <class Check>
void check_option(const std::string& opt, Check&& check) {
  try {
    check("option " + opt);
  } catch (const tc::Error& e) {
    throw UsageError(e.what());
  }
}

int parse_level(const std::string& opt, const std::string& v) {
  const int level = v == "-1" ? -1 : (int)parse_uint(opt, v, 0, INT32_MAX);
  check_option(opt, [&](const std::string& what) { tc::check_level(level, what); });
  return level;
}

unsigned parse_block_elems(const std::string& opt, const std::string& v) {
  const uint64_t n = parse_uint(opt, v, 0, UINT32_MAX);
  check_option(opt, [&](const std::string& what) { tc::check_block_elems(n, what); });
  return (unsigned)n;
}

uint64_t parse_chunk_mib(const std::string& opt, const std::string& v) {
  const uint64_t mib = parse_uint(opt, v, 1, UINT32_MAX);
  check_option(opt, [&](const std::string& what) { tc::check_chunk_bytes(mib << 20, what); });
  return mib;
}

// A path given to an option: an empty one is a mistake (an unset shell
// variable), not "no option".
std::string path_value(const std::string& opt, const std::string& v) {
  if (v.empty()) throw UsageError("option " + opt + " needs a path, got an empty string");
  return v;
}

bool is(const Args& a, std::initializer_list<const char*> cmds) {
  for (const char* c : cmds)
    if (a.command == c) return true;
  return false;
}

// One option, long or short, with its value getter; false if unknown.
template <class Value, class Flag>
bool apply_option(Args& a, const std::string& s, Value&& value, Flag&& flag) {
  if (s == "-h" || s == "--help") flag(), a.help = true;
  else if (s == "-f" || s == "--force") flag(), a.force = true;
  else if (s == "-q" || s == "--quiet") flag(), verbosity = 0;
  else if (s == "-v" || s == "--verbose") flag(), verbosity = 2;
  else if ((s == "-k" || s == "--keep") && is(a, {"compress", "decompress"})) flag(), a.remove_inputs = false;
  else if (s == "--rm" && is(a, {"compress", "decompress"})) flag(), a.remove_inputs = true;
  else if ((s == "-c" || s == "--stdout") && is(a, {"compress", "decompress"})) flag(), a.to_stdout = true;
  else if (s == "--json" && a.command == "inspect") flag(), a.json = true;
  else if (s == "-o" || s == "--output") a.output = path_value(s, value());
  else if (s == "-T" || s == "--threads") a.threads = (unsigned)parse_uint(s, value(), 0, 4096);
  else if ((s == "-l" || s == "--level") && a.command == "compress") a.level = parse_level(s, value()), a.have_level = true;
  else if (s == "--block-elems" && a.command == "compress") a.block_elems = parse_block_elems(s, value());
  else if (s == "--chunk-mib" && a.command == "compress") a.chunk_mib = parse_chunk_mib(s, value());
  else if (s == "--against" && a.command == "verify") a.against = path_value(s, value());
  else if (s == "--ref" && is(a, {"compress", "decompress", "verify", "rebase"})) a.refs.push_back(path_value(s, value()));
  else if (s == "--ref-original" && is(a, {"compress", "decompress"})) a.ref_origs.push_back(path_value(s, value()));
  else if (s == "--no-predict" && is(a, {"compress", "rebase"})) flag(), a.no_predict = true;
  else if (s == "--independent" && a.command == "compress") flag(), a.independent = true;
  else if (s == "--meta" && a.command == "compress") {
    const std::string kv = value();
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError("--meta needs KEY=VALUE, got '" + kv + "'");
    a.meta[kv.substr(0, eq)] = kv.substr(eq + 1);
  } else if (s == "--max-mib" && a.command == "bench") a.max_mib = parse_uint(s, value(), 1, 1u << 30);
  else if (s == "--levels" && a.command == "bench") {
    const std::string l = value();
    size_t p = 0;
    while (p <= l.size()) {
      const size_t q = std::min(l.find(',', p), l.size());
      a.levels.push_back(parse_level(s, l.substr(p, q - p)));
      p = q + 1;
    }
  } else {
    return false;
  }
  return true;
}

[[noreturn]] void unknown(const Args& a, const std::string& s) {
  throw UsageError("unknown option '" + s + "' for '" + a.command + "' (try 'tzip " + a.command + " --help')");
}

// Short options that take a value: the rest of the bundle, or the next argument.
bool takes_value(char c) { return c == 'o' || c == 'T' || c == 'l'; }

}  // namespace

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
    const std::string arg = argv[i];
    if (only_pos || arg.empty() || arg[0] != '-' || arg == "-") {
      a.inputs.push_back(arg);
      continue;
    }
    if (arg == "--") {
      only_pos = true;
      continue;
    }
    if (arg.rfind("--", 0) == 0) {
      std::string s = arg, val;
      bool has_eq = false;
      const auto eq = s.find('=');
      if (eq != std::string::npos) val = s.substr(eq + 1), s = s.substr(0, eq), has_eq = true;
      auto value = [&]() -> std::string {
        if (has_eq) return val;
        if (i + 1 >= argc) throw UsageError("option " + s + " needs a value");
        return argv[++i];
      };
      auto flag = [&] {
        if (has_eq) throw UsageError("option " + s + " takes no value");
      };
      if (!apply_option(a, s, value, flag)) unknown(a, s);
      continue;
    }
    // A bundle of short options: -qv, -fT4, -o out, -oout, -3, -l-1.
    for (size_t k = 1; k < arg.size(); ++k) {
      const char c = arg[k];
      if (c >= '0' && c <= '9') {
        size_t e = k;
        while (e < arg.size() && arg[e] >= '0' && arg[e] <= '9') ++e;
        const std::string n = arg.substr(k, e - k);
        if (a.command != "compress") unknown(a, "-" + n);
        if (n != "1" && n != "2" && n != "3")
          throw UsageError("level -" + n + " does not exist: levels are -1, -2, -3 (and -l -1: store)");
        a.level = n[0] - '0';
        a.have_level = true;
        k = e - 1;
        continue;
      }
      const std::string s = std::string("-") + c;
      if (takes_value(c)) {
        const std::string rest = arg.substr(k + 1);
        auto value = [&]() -> std::string {
          if (!rest.empty()) return rest;
          if (i + 1 >= argc) throw UsageError("option " + s + " needs a value");
          return argv[++i];
        };
        if (!apply_option(a, s, value, [] {})) unknown(a, s);
        break;  // the value used up the bundle
      }
      if (!apply_option(a, s, []() -> std::string { return {}; }, [] {})) unknown(a, s);
    }
  }
  if (a.output == "-") a.to_stdout = true, a.output.clear();
  return a;
}

}  // namespace tzip

// tzip compress, decompress, rebase.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <thread>

#include "tzip_cli.hpp"

namespace tzip {

using tc::ErrorKind;

namespace {

std::string base_name(const std::string& p) {
  const auto k = p.find_last_of('/');
  return k == std::string::npos ? p : p.substr(k + 1);
}

void check_exists(const std::string& in) {
  const tc::PathKind k = tc::path_kind(in);
  if (k == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file or folder");
  if (k == tc::PathKind::kOther) throw tc::Error(ErrorKind::kUsage, in + ": not a regular file or folder");
}

// Standard input/output and --rm: what may be combined with what.
struct Streams {
  std::vector<std::string> inputs;  // "-" replaced by the spooled stdin path
  bool from_stdin = false;
  bool to_stdout = false;
};

Streams resolve_streams(const Args& a) {
  Streams s;
  s.inputs = a.inputs;
  const size_t n_stdin = (size_t)std::count(a.inputs.begin(), a.inputs.end(), "-");
  if (n_stdin > 1 || (n_stdin && a.inputs.size() > 1))
    throw UsageError(a.command + ": standard input ('-') must be the only input");
  s.from_stdin = n_stdin == 1;
  s.to_stdout = a.to_stdout || (s.from_stdin && a.output.empty());
  if (s.to_stdout && a.inputs.size() > 1)
    throw UsageError(a.command + ": standard output takes one input (several outputs cannot share it)");
  if (s.to_stdout && !a.output.empty()) throw UsageError(a.command + ": give either -c/--stdout or -o, not both");
  if (a.remove_inputs && (s.from_stdin || s.to_stdout))
    throw UsageError("--rm needs an input file and an output file (not standard input or output)");
  if (s.to_stdout) check_stdout_usable();
  if (s.from_stdin)
    s.inputs[0] = stdin_path(a.command == "compress" ? StdinFormat::kSafetensors : StdinFormat::kTzip);
  struct stat out_st;
  if (s.to_stdout && fstat(STDOUT_FILENO, &out_st) == 0 && S_ISREG(out_st.st_mode))
    for (const auto& in : s.inputs) {
      struct stat in_st;
      if (stat(in.c_str(), &in_st) == 0 && in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino)
        throw UsageError(in + ": standard output is the input file");
    }
  for (const auto& in : s.inputs) {
    check_exists(in);
    if (s.to_stdout && tc::path_kind(in) == tc::PathKind::kDir)
      throw UsageError(in + ": a folder cannot be written to standard output");
    if (a.remove_inputs && tc::path_kind(in) == tc::PathKind::kDir)
      throw UsageError(in + ": --rm removes input files, not folders");
  }
  return s;
}

tc::WriteOptions write_options(const Args& a) {
  tc::WriteOptions o;
  o.level = a.level;
  o.threads = a.threads;
  o.block_elems = a.block_elems;
  o.force = a.force;
  o.chunk_bytes = a.chunk_mib << 20;
  o.user_metadata = a.meta;
  o.predict = !a.no_predict;
  o.cross_file = !a.independent;
  return o;
}

// --rm removes an input only once its output is a file on disk: an output
// that is a FIFO or a device is refused before any work.
void check_rm_output(const Args& a, const std::string& out) {
  if (a.remove_inputs && tc::path_kind(out) == tc::PathKind::kOther)
    throw UsageError("--rm needs an output file: " + out + " is not a regular file (nothing was written)");
}

// --rm never removes a .tzip file that another one in its folder needs,
// unless that one is removed by the same command too.
void check_rm_keeps_references(const std::vector<std::string>& files) {
  auto among = [&](const std::string& p) {
    struct stat a, b;
    if (stat(p.c_str(), &a) != 0) return false;
    for (const auto& f : files)
      if (stat(f.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return true;
    return false;
  };
  for (const auto& f : files)
    for (const auto& dep : tc::dependents_of(f))
      if (!among(dep))
        throw UsageError("--rm: " + f + " is not removed: " + dep + " needs it to decompress (it is recorded as its "
                         "reference); decompress both, or rebase " + dep + " first (tzip rebase)");
}

// --rm after compress: each output decompressed in memory and compared with
// its input before the input goes (outputs are fsync'd by the library).
void remove_after_compress(const std::vector<std::string>& ins, const std::vector<std::string>& outs, unsigned threads) {
  for (size_t i = 0; i < ins.size(); ++i) {
    tc::ReadOptions ro;
    ro.threads = threads;
    tc::Reader(outs[i], threads).verify(ins[i], ro);
  }
  for (const auto& in : ins) remove_input(in);
}

// --ref / --ref-original for several inputs compressed together: one per
// input, or one folder each holding the files of the same names.
void checkpoint_refs(const Args& a, const std::vector<std::string>& inputs, const std::vector<std::string>& outs,
                     std::vector<std::string>* refs, std::vector<std::string>* ref_origs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (a.refs.size() == inputs.size()) {
      refs->push_back(a.refs[i]);
      if (!a.ref_origs.empty()) ref_origs->push_back(a.ref_origs[i]);
    } else if (a.refs.size() == 1) {
      if (tc::path_kind(a.refs[0]) != tc::PathKind::kDir)
        throw UsageError("--ref: with several inputs, give a folder of .tzip files or one --ref per input");
      const std::string r = a.refs[0] + "/" + base_name(outs[i]);
      refs->push_back(tc::path_kind(r) == tc::PathKind::kFile ? r : std::string());
      if (!a.ref_origs.empty()) {
        if (tc::path_kind(a.ref_origs[0]) != tc::PathKind::kDir)
          throw UsageError("--ref-original: with a --ref folder, give a folder of .safetensors files");
        const std::string ro = a.ref_origs[0] + "/" + base_name(inputs[i]);
        ref_origs->push_back(!refs->back().empty() && tc::path_kind(ro) == tc::PathKind::kFile ? ro : std::string());
      }
    }
  }
}

}  // namespace

int cmd_compress(const Args& a) {
  if (a.inputs.empty()) throw UsageError("compress: no input given (try 'tzip compress --help')");
  const Streams io = resolve_streams(a);
  const std::vector<std::string>& inputs = io.inputs;
  const bool many = inputs.size() > 1;
  if (many && !a.output.empty() && tc::path_kind(a.output) != tc::PathKind::kDir)
    throw UsageError("-o must be an existing folder when several inputs are given");
  tc::WriteOptions o = write_options(a);
  if (io.to_stdout) o.output_fd = STDOUT_FILENO;
  if (verbosity >= 2)
    std::fprintf(stderr, "tzip: level %s, %u threads, %" PRIu64 " MiB chunks, block %s elements\n",
                 a.level == 0 ? "default (1)" : std::to_string(a.level).c_str(),
                 a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency()), a.chunk_mib,
                 a.block_elems ? std::to_string(a.block_elems).c_str() : "default");
  auto out_name = [&](const std::string& in, bool dir) {
    if (io.to_stdout) return std::string("stdout");
    if (io.from_stdin) {
      if (a.output.empty()) throw UsageError("compress: give -o for the output of standard input");
      if (tc::path_kind(a.output) == tc::PathKind::kDir)
        throw UsageError(a.output + ": standard input has no name; give -o FILE");
      return a.output;
    }
    if (!a.output.empty() && tc::path_kind(a.output) != tc::PathKind::kDir) return output_for(a, in, "");
    if (dir && !a.output.empty() && is_output_folder_of(in, a.output, true)) return a.output;
    const std::string def = tc::default_compressed_name(in, dir);
    if (def.empty()) throw UsageError(in + ": has no name to derive the output from; give -o");
    return output_for(a, in, def);
  };
  bool all_files = true;
  for (const auto& in : inputs) all_files = all_files && tc::path_kind(in) == tc::PathKind::kFile;
  if (a.refs.size() > 1 && a.refs.size() != inputs.size())
    throw UsageError("--ref: give one previous checkpoint per input, or one (a file, or a folder of .tzip files)");
  if (!a.ref_origs.empty() && a.ref_origs.size() != a.refs.size())
    throw UsageError("--ref-original: give one per --ref (the previous checkpoint's safetensors content)");
  // Several safetensors files: one checkpoint, compressed together so that
  // casts across files are found (doc/container.md section 12).
  if (many && all_files) {
    std::vector<std::string> outs, refs, ref_origs;
    for (const auto& in : inputs) outs.push_back(out_name(in, false)), check_rm_output(a, outs.back());
    checkpoint_refs(a, inputs, outs, &refs, &ref_origs);
    Progress bar("checkpoint");
    o.progress = bar.fn();
    const double t0 = now_s();
    const tc::PassStats st = tc::compress_checkpoint(inputs, outs, o, refs, ref_origs);
    const double el = now_s() - t0;
    bar.finish();
    for (size_t i = 0; i < outs.size(); ++i) say(inputs[i] + " -> " + outs[i]);
    say("checkpoint: " + human(st.raw_bytes) + " -> " + human(st.file_bytes) + " (ratio " +
        ratio_str(st.raw_bytes, st.file_bytes) + ", " + human(st.raw_bytes / std::max(el, 1e-9)) + "/s)");
    if (!a.independent || !refs.empty()) report_dependencies(outs);
    if (a.remove_inputs) remove_after_compress(inputs, outs, a.threads);
    return kExitOk;
  }
  for (const auto& in : inputs) check_rm_output(a, out_name(in, tc::path_kind(in) == tc::PathKind::kDir));
  for (size_t ii = 0; ii < inputs.size(); ++ii) {
    const std::string& in = inputs[ii];
    const bool dir = tc::path_kind(in) == tc::PathKind::kDir;
    const std::string out = out_name(in, dir);
    o.ref = a.refs.size() == inputs.size() ? a.refs[ii] : a.refs.size() == 1 ? a.refs[0] : std::string();
    o.ref_original = a.ref_origs.size() == inputs.size() ? a.ref_origs[ii]
                     : a.ref_origs.size() == 1               ? a.ref_origs[0]
                                                             : std::string();
    Progress bar(display_name(in));
    o.progress = bar.fn();
    const double t0 = now_s();
    uint64_t raw, comp;
    if (dir) {
      tc::compress_folder(in, out, o);
      raw = verbosity >= 1 ? tree_size(in) : 0;  // for the message only
      comp = verbosity >= 1 ? tree_size(out) : 0;
    } else {
      const tc::PassStats st = tc::compress_file(in, out, o);
      raw = st.raw_bytes;
      comp = st.file_bytes;
    }
    const double el = now_s() - t0;
    bar.finish();
    say(display_name(in) + " -> " + out + ": " + human(raw) + " -> " + human(comp) + " (ratio " + ratio_str(raw, comp) +
        ", " + human(raw / std::max(el, 1e-9)) + "/s)");
    // One file can need another only through --ref (casts across files need several inputs).
    if (dir) report_dependencies(files_with_suffix(out, ".tzip"));
    else if (!io.to_stdout && !o.ref.empty()) report_dependencies({out});
    if (a.remove_inputs) remove_after_compress({in}, {out}, a.threads);
  }
  return kExitOk;
}

int cmd_decompress(const Args& a) {
  if (a.inputs.empty()) throw UsageError("decompress: no input given (try 'tzip decompress --help')");
  const Streams io = resolve_streams(a);
  const std::vector<std::string>& inputs = io.inputs;
  const bool many = inputs.size() > 1;
  if (many && !a.output.empty() && tc::path_kind(a.output) != tc::PathKind::kDir)
    throw UsageError("-o must be an existing folder when several inputs are given");
  tc::ReadOptions o;
  o.threads = a.threads;
  o.force = a.force;
  o.refs = a.refs;
  o.ref_originals = a.ref_origs;
  if (io.to_stdout) o.output_fd = STDOUT_FILENO;
  auto out_name = [&](const std::string& in, bool dir) {
    if (io.to_stdout) return std::string("stdout");
    if (io.from_stdin) {
      if (tc::path_kind(a.output) == tc::PathKind::kDir)
        throw UsageError(a.output + ": standard input has no name; give -o FILE");
      return a.output;
    }
    if (!a.output.empty() && tc::path_kind(a.output) != tc::PathKind::kDir) return output_for(a, in, "");
    if (dir && !a.output.empty() && is_output_folder_of(in, a.output, false)) return a.output;
    const std::string def = tc::default_decompressed_name(in, dir);
    if (def.empty())
      throw UsageError(in + ": name does not end in .tzip; give the output name with -o" +
                       (many ? std::string(" (an existing folder)") : std::string()));
    return output_for(a, in, def);
  };
  // Files are restored together (references between them served from the
  // restored bytes; all or nothing); folders one by one.
  std::vector<std::string> files, file_outs;
  for (const auto& in : inputs)
    if (tc::path_kind(in) == tc::PathKind::kFile) files.push_back(in), file_outs.push_back(out_name(in, false));
  for (const auto& out : file_outs) check_rm_output(a, out);
  if (a.remove_inputs) check_rm_keeps_references(files);
  if (!a.refs.empty() && files.size() != inputs.size())
    throw UsageError("--ref applies to .tzip files (a folder uses its recorded paths)");
  if (files.size() > 1) {
    Progress bar("checkpoint");
    o.progress = bar.fn();
    const double t0 = now_s();
    const tc::PassStats st = tc::decompress_checkpoint(files, file_outs, o);
    const double el = now_s() - t0;
    bar.finish();
    for (size_t i = 0; i < files.size(); ++i) say(files[i] + " -> " + file_outs[i]);
    say("checkpoint: " + human(st.file_bytes) + " -> " + human(st.raw_bytes) + " (" +
        human(st.raw_bytes / std::max(el, 1e-9)) + "/s)");
  }
  for (const auto& in : inputs) {
    const bool dir = tc::path_kind(in) == tc::PathKind::kDir;
    if (!dir && files.size() > 1) continue;  // done above
    const std::string out = out_name(in, dir);
    Progress bar(display_name(in));
    o.progress = bar.fn();
    const double t0 = now_s();
    uint64_t raw, comp;
    if (dir) {
      tc::decompress_folder(in, out, o);
      raw = verbosity >= 1 ? tree_size(out) : 0;  // for the message only
      comp = verbosity >= 1 ? tree_size(in) : 0;
    } else {
      tc::Reader r(in, a.threads);
      const tc::PassStats st = r.export_safetensors(out, o);
      raw = st.raw_bytes;
      comp = st.file_bytes;
    }
    const double el = now_s() - t0;
    bar.finish();
    say(display_name(in) + " -> " + out + ": " + human(comp) + " -> " + human(raw) + " (" +
        human(raw / std::max(el, 1e-9)) + "/s)");
  }
  if (a.remove_inputs) {
    // Each restored file compared with its input (decoded again, in memory)
    // before any input goes.
    for (size_t i = 0; i < files.size(); ++i) {
      tc::ReadOptions ro;
      ro.threads = a.threads;
      ro.refs = a.refs;
      tc::Reader(files[i], a.threads).verify(file_outs[i], ro);
    }
    for (const auto& f : files) remove_input(f);
  }
  return kExitOk;
}

int cmd_rebase(const Args& a) {
  if (a.inputs.empty()) throw UsageError("rebase: give a .tzip file (try 'tzip rebase --help')");
  if (a.output.empty()) throw UsageError("rebase: give the output with -o");
  if (a.inputs.size() > 1 && tc::path_kind(a.output) != tc::PathKind::kDir)
    throw UsageError("-o must be an existing folder when several inputs are given");
  for (const auto& in : a.inputs) {
    if (tc::path_kind(in) == tc::PathKind::kMissing) throw tc::Error(ErrorKind::kIO, in + ": no such file");
    if (tc::path_kind(in) != tc::PathKind::kFile) throw tc::Error(ErrorKind::kUsage, in + ": not a .tzip file");
  }
  for (const auto& in : a.inputs) {
    const std::string out = output_for(a, in, base_name(in));
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
    const tc::PassStats st = tc::rebase(in, out, w, ro);
    say(in + " -> " + out + " (standalone): " + human(st.raw_bytes) + " -> " + human(st.file_bytes) + " (ratio " +
        ratio_str(st.raw_bytes, st.file_bytes) + ", " + fmt("%.2f s", now_s() - t0) + ")");
  }
  return kExitOk;
}

}  // namespace tzip

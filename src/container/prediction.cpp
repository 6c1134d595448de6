// Checkpoint-aware coding across files (doc/container.md section 12):
// several safetensors files of one checkpoint compressed together so that
// BF16/F16 tensors of one file may be predicted from FP32 tensors of another,
// and rebase (a delta file made standalone).
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "codec/predict.h"

#include "internal.hpp"
#include "file_io.hpp"
#include "prediction.hpp"

namespace tz::container {

using namespace detail;

namespace detail {

RefOriginal::RefOriginal(const std::string& path, const Reader& ref, const std::string& ref_path)
    : path_(path), ref_path_(ref_path), info_(read_safetensors_info(path)), file_(std::make_unique<InFile>(path)) {
  if (info_.header_bytes != ref.safetensors_header() || file_->size() != ref.original_size())
    fail(ErrorKind::kUsage, path + ": is not the safetensors file " + ref_path + " decodes to (header or size differs)");
}

void RefOriginal::read_checked(Reader& ref, size_t index, uint64_t off, uint64_t n, uint8_t* dst) const {
  const TensorEntry& t = ref.tensors()[index];
  const uint64_t base = tensor_offset(t);
  file_->pread_exact(base + off, dst, n);
  const bool same = ref.check_bytes(
      index, off, n, [&](uint64_t o, uint64_t len, uint8_t* d) { file_->pread_exact(base + o, d, len); }, dst);
  if (!same)
    fail(ErrorKind::kUsage, path_ + ": tensor '" + t.name + "' differs from " + ref_path_ +
                                " (block checksums): not the content of the reference");
}

namespace {
std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i < p.size()) {
    const size_t j = std::min(p.find('/', i), p.size());
    if (j > i) v.push_back(p.substr(i, j - i));
    i = j + 1;
  }
  return v;
}
std::string real_dir(const std::string& file) {
  const std::string d = dir_of(file);
  char buf[PATH_MAX];
  if (!realpath(d.c_str(), buf)) fail_errno(d, "cannot resolve folder", errno);
  return buf;
}
}  // namespace

namespace {
// log2 of a count: samples are at most 16384 elements, so a table of the
// same values std::log2 returns replaces ~1000 calls per tensor sampled.
double log2_of(uint64_t c) {
  static const std::vector<double> table = [] {
    std::vector<double> t(16385);
    for (size_t i = 1; i < t.size(); ++i) t[i] = std::log2((double)i);
    return t;
  }();
  return c < table.size() ? table[c] : std::log2((double)c);
}
}  // namespace

// Order-0 cost, in bits, of n elements of esz bytes, one histogram per byte
// plane (what the codec's per-plane coding approaches on float data).
double plane_cost(const uint8_t* p, size_t n, unsigned esz) {
  // One pass over the elements, one histogram per byte plane, each split
  // in 4 copies (element i counts into copy i % 4) so that runs of equal
  // bytes (exponents) do not serialize on one counter.
  std::vector<uint32_t> h((size_t)esz * 256 * 4, 0);
  uint32_t* hp = h.data();
  auto count = [&](auto kesz) {
    constexpr unsigned K = decltype(kesz)::value;
    size_t i = 0;
    for (; i + 4 <= n; i += 4, p += 4 * K)
      for (unsigned b = 0; b < K; ++b) {
        ++hp[(0 * K + b) * 256 + p[b]];
        ++hp[(1 * K + b) * 256 + p[K + b]];
        ++hp[(2 * K + b) * 256 + p[2 * K + b]];
        ++hp[(3 * K + b) * 256 + p[3 * K + b]];
      }
    for (; i < n; ++i, p += K)
      for (unsigned b = 0; b < K; ++b) ++hp[b * 256 + p[b]];
  };
  if (esz == 4) count(std::integral_constant<unsigned, 4>{});
  else if (esz == 2) count(std::integral_constant<unsigned, 2>{});
  else if (esz == 1) count(std::integral_constant<unsigned, 1>{});
  else
    for (size_t i = 0; i < n; ++i, p += esz)
      for (unsigned b = 0; b < esz; ++b) ++hp[b * 256 + p[b]];
  double bits = 0;
  const double ln = std::log2((double)n);
  const size_t plane = (size_t)esz * 256;
  for (unsigned b = 0; b < esz; ++b)
    for (unsigned v = 0; v < 256; ++v) {
      const size_t k = b * 256 + v;
      const uint64_t c = (uint64_t)hp[k] + hp[plane + k] + hp[2 * plane + k] + hp[3 * plane + k];
      if (c) bits -= (double)c * (log2_of(c) - ln);
    }
  return bits;
}

SampleRuns sample_runs(uint64_t n, uint64_t R) {
  SampleRuns s;
  const uint64_t L = 16384 / R;
  if (n <= L * R) {
    s.runs.push_back({0, n});
  } else {
    for (uint64_t k = 0; k < R; ++k) s.runs.push_back({R == 1 ? (n - L) / 2 : (n - L) * k / (R - 1), L});
  }
  for (const auto& r : s.runs) s.elems += r.second;
  return s;
}

int cast_kind(const std::string& dtype) {
  if (dtype == "BF16") return tz::predict::kCastBF16;
  if (dtype == "F16") return tz::predict::kCastF16;
  return -1;
}

long find_cast_source(uint64_t n, int kind, double min_gain, size_t n_cands, const CastData& data,
                      bool stop_at_exact, CastScratch* scratch) {
  if (n_cands == 0 || n == 0) return -1;
  const uint64_t pa = n > 64 ? (n - 64) / 2 : 0, pn = std::min<uint64_t>(64, n);
  const SampleRuns sr = sample_runs(n);
  auto& tprobe = scratch->probe;
  tprobe.resize(pn * 2);
  data.read_target(pa, pn, tprobe.data());
  // The target's own sample and its cost, read only when a candidate
  // survives the probe (most tensors have none).
  bool have_sample = false;
  double best = 0;
  long winner = -1;
  for (size_t i = 0; i < n_cands; ++i) {
    const uint8_t* cprobe = data.cand_probe(i, pa, pn);
    uint64_t hits = 0;
    for (uint64_t e = 0; e < pn; ++e)
      hits += tz::predict::cast_f32(load_le32(cprobe + 4 * e), kind) == load_le16(tprobe.data() + 2 * e);
    if (hits * 2 < pn) continue;  // fewer than half exact: not a cast of this tensor
    if (!have_sample) {
      have_sample = true;
      scratch->sample.resize(sr.elems * 2);
      uint64_t o = 0;
      for (const auto& r : sr.runs) data.read_target(r.first, r.second, scratch->sample.data() + o), o += r.second * 2;
      best = plane_cost(scratch->sample.data(), sr.elems, 2) * (1.0 - min_gain);
    }
    scratch->cand.resize(sr.elems * 4);
    uint64_t o = 0;
    for (const auto& r : sr.runs) data.read_cand(i, r.first, r.second, scratch->cand.data() + o), o += r.second * 4;
    scratch->resid = scratch->sample;
    tz::predict::cast_xor(scratch->cand.data(), scratch->resid.data(), sr.elems, kind);
    const double cost = plane_cost(scratch->resid.data(), sr.elems, 2);
    if (cost < best) {
      best = cost;
      winner = (long)i;
      if (stop_at_exact && hits == pn) break;  // exact on the probe: good enough, stop searching
    }
  }
  return winner;
}

DeltaWindow delta_window(const TensorEntry& rt, unsigned esz) {
  DeltaWindow w;
  const uint64_t rbb = rt.block_bytes();
  w.blk_off = (rt.n_blocks() / 2) * rbb;
  w.blk_len = std::min(rbb, rt.raw_size() - w.blk_off);
  w.first = w.blk_off / esz;
  w.elems = std::min<uint64_t>(16384, w.blk_len / esz);
  return w;
}

bool delta_pays(uint8_t* cur, const uint8_t* ref, uint64_t elems, unsigned esz, double min_gain) {
  const double base = plane_cost(cur, elems, esz);
  tz::predict::xor_bytes(ref, cur, elems * esz);
  return plane_cost(cur, elems, esz) < base * (1.0 - min_gain);
}

std::string relative_path(const std::string& target, const std::string& from_file) {
  const auto t = split_path(real_dir(target));
  const auto f = split_path(real_dir(from_file));
  size_t k = 0;
  while (k < t.size() && k < f.size() && t[k] == f[k]) ++k;
  std::string r;
  for (size_t i = k; i < f.size(); ++i) r += "../";
  for (size_t i = k; i < t.size(); ++i) r += t[i] + "/";
  return r + base_of(target);
}

}  // namespace detail

namespace {
// Runs `write` (which writes the staged file `stage`); an error it reports
// names the output the user gave, not the hidden staging name.
template <class Write>
PassStats named_as(const std::string& stage, const std::string& final_path, Write&& write) {
  try {
    return write();
  } catch (const Error& e) {
    std::string m = e.what();
    const std::string shown = printable(stage);  // as the message holds it
    for (size_t k; (k = m.find(shown)) != std::string::npos;) m.replace(k, shown.size(), final_path);
    throw Error(e.kind(), m, e.sys_errno());
  }
}

// The outputs of one compress_checkpoint / decompress_checkpoint call,
// staged under temporary names beside their final names and published
// together at the end. Until publish_all() returns, destroying it undoes
// everything: staged files are removed, published outputs are removed and
// the files they replaced (force) are put back.
struct StagedOutputs {
  struct Item {
    std::string final_path;
    Temporary stage;       // the new file; after an exchange, the replaced one
    bool published = false;
    bool exchanged = false;  // stage now holds the file final_path had
  };
  std::vector<Item> items;
  bool committed = false;

  ~StagedOutputs() {
    if (committed) return;
    auto lk = output_lock();
    for (auto it = items.rbegin(); it != items.rend(); ++it) {
      if (it->exchanged) {
        restore_replaced(it->stage, it->final_path);
      } else if (it->published) {
        unlink(it->final_path.c_str());
      }
    }
    // each stage (new file, or the new file swapped back) is removed by its Temporary
  }
  // Publishes every staged file onto its final name (publish_keeping_replaced:
  // an existing final, refused up front unless force, is exchanged with the
  // staged file in one step and removed only once every output is in
  // place). Under the output lock: a signal watchdog sees all of it or none
  // of it.
  void publish_all(bool force) {
    auto lk = output_lock();
    std::vector<std::string> finals;
    for (const auto& it : items) finals.push_back(it.final_path);
    for (auto& it : items) {
      if (publish_keeping_replaced(it.stage, it.final_path, force, finals)) {
        it.exchanged = true;
        continue;
      }
      it.stage.release();
      it.published = true;
    }
    committed = true;
    for (auto& it : items) {
      if (it.exchanged) it.stage.remove();  // the replaced file
      fsync_dir_of(it.final_path);
    }
  }
};
}  // namespace

PassStats compress_checkpoint(const std::vector<std::string>& ins, const std::vector<std::string>& outs,
                              const WriteOptions& opt, const std::vector<std::string>& refs,
                              const std::vector<std::string>& ref_originals) {
  if (ins.size() != outs.size()) fail(ErrorKind::kUsage, "compress_checkpoint: as many outputs as inputs are needed");
  if (!refs.empty() && refs.size() != ins.size())
    fail(ErrorKind::kUsage, "compress_checkpoint: give one reference per input (empty for none) or none");
  if (!ref_originals.empty() && ref_originals.size() != ins.size())
    fail(ErrorKind::kUsage, "compress_checkpoint: give one reference original per input (empty for none) or none");
  if (!opt.ref.empty() || !opt.ref_original.empty())
    fail(ErrorKind::kUsage, "compress_checkpoint: give references per input (refs, ref_originals), not in the options");
  // Everything that can be checked before any work: outputs distinct, none
  // of them an input or a reference, none existing unless force.
  for (size_t i = 0; i < outs.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (outs[i] == outs[j]) fail(ErrorKind::kUsage, outs[i] + ": given as the output of two inputs");
    for (size_t j = 0; j < ins.size(); ++j) {
      check_not_same_file(ins[j], outs[i]);
      if (!refs.empty() && !refs[j].empty()) check_not_same_file(refs[j], outs[i]);
    }
    if (check_file_target(outs[i], opt.force, outs) == FileTarget::kStream)
      fail(ErrorKind::kUsage, outs[i] + ": not a regular file (several outputs are written to files)");
  }
  std::vector<SafetensorsInfo> infos;
  for (const auto& in : ins) infos.push_back(read_safetensors_info(in));
  // Files holding no BF16/F16 tensor go first: they can be cast sources.
  std::vector<size_t> order(ins.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto has_target = [&](size_t i) {
    for (const auto& t : infos[i].tensors)
      if (t.dtype == "BF16" || t.dtype == "F16") return true;
    return false;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return !has_target(a) && has_target(b); });
  StagedOutputs staged;
  staged.items.resize(ins.size());
  std::vector<CastSourceFile> written;
  PassStats total;
  for (size_t i : order) {
    check_cancel();
    auto& it = staged.items[i];
    it.final_path = outs[i];
    remove_stale_temporaries(outs[i]);
    it.stage = Temporary::reserve(outs[i]);
    WriteOptions o = opt;
    o.force = false;
    o.output_fd = -1;
    o.ref = refs.empty() ? std::string() : refs[i];
    o.ref_original = ref_originals.empty() ? std::string() : ref_originals[i];
    const PassStats st = named_as(it.stage.path(), outs[i], [&] {
      return compress_safetensors(ins[i], it.stage.path(), o,
                                  opt.predict && opt.cross_file ? written : std::vector<CastSourceFile>{});
    });
    total.raw_bytes += st.raw_bytes;
    total.file_bytes += st.file_bytes;
    if (opt.predict) {
      CastSourceFile c;
      c.st_path = ins[i];
      c.st = infos[i];
      c.tzip_path = outs[i];  // recorded by its final name (same folder as the staged file)
      const Reader staged_reader(it.stage.path(), 1);
      c.xxh64 = staged_reader.file_checksum();
      c.header_xxh64 = staged_reader.header_checksum();
      written.push_back(std::move(c));
    }
  }
  staged.publish_all(opt.force);
  return total;
}

PassStats decompress_checkpoint(const std::vector<std::string>& ins, const std::vector<std::string>& outs,
                                const ReadOptions& opt) {
  if (ins.size() != outs.size()) fail(ErrorKind::kUsage, "decompress_checkpoint: as many outputs as inputs are needed");
  // All or nothing, as compress_checkpoint: outputs checked before any
  // work, staged beside their final names, published together.
  for (size_t i = 0; i < outs.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (outs[i] == outs[j]) fail(ErrorKind::kUsage, outs[i] + ": given as the output of two inputs");
    for (const auto& in : ins) check_not_same_file(in, outs[i]);
    for (const auto& r : opt.refs) check_not_same_file(r, outs[i]);
    if (check_file_target(outs[i], opt.force, outs) == FileTarget::kStream)
      fail(ErrorKind::kUsage, outs[i] + ": not a regular file (several outputs are written to files)");
  }
  StagedOutputs staged;
  staged.items.resize(ins.size());
  // Checksums and references first (headers only; no file kept open).
  std::vector<uint64_t> sum(ins.size());
  std::vector<std::vector<uint64_t>> needs(ins.size());
  for (size_t i = 0; i < ins.size(); ++i) {
    Reader r(ins[i], 1);
    sum[i] = r.file_checksum();
    for (const auto& ref : r.references()) needs[i].push_back(ref.xxh64);
  }
  // Referenced files first (a file is ready once every reference that is
  // also an input has been restored).
  std::vector<bool> done(ins.size(), false);
  PassStats total;
  for (size_t round = 0; round < ins.size(); ++round) {
    size_t pick = ins.size();
    for (size_t i = 0; i < ins.size() && pick == ins.size(); ++i) {
      if (done[i]) continue;
      bool ready = true;
      for (uint64_t x : needs[i])
        for (size_t j = 0; j < ins.size(); ++j)
          if (!done[j] && j != i && sum[j] == x) ready = false;
      if (ready) pick = i;
    }
    if (pick == ins.size()) fail(ErrorKind::kBadInput, ins[0] + ": references between the files form a cycle");
    Reader r(ins[pick], opt.threads);
    if (!opt.ref_originals.empty() && opt.ref_originals.size() != opt.refs.size())
      fail(ErrorKind::kUsage, "reference originals: give one per reference file (--ref-original pairs with --ref)");
    for (size_t k = 0; k < opt.refs.size(); ++k) {
      const std::string& p = opt.refs[k];
      const uint64_t sum = Reader(p, 1).file_checksum();
      for (const auto& ref : r.references())
        if (ref.xxh64 == sum) {
          r.add_reference_path(p);
          if (!opt.ref_originals.empty() && !opt.ref_originals[k].empty())
            r.add_reference_original(p, opt.ref_originals[k]);
          break;
        }
    }
    for (size_t j = 0; j < ins.size(); ++j)
      if (done[j] && std::find(needs[pick].begin(), needs[pick].end(), sum[j]) != needs[pick].end())
        r.add_reference_original(ins[j], staged.items[j].stage.path());
    ReadOptions o = opt;
    o.refs.clear();
    o.ref_originals.clear();
    o.force = false;
    o.output_fd = -1;
    auto& it = staged.items[pick];
    it.final_path = outs[pick];
    remove_stale_temporaries(outs[pick]);
    it.stage = Temporary::reserve(outs[pick]);
    const PassStats st = named_as(it.stage.path(), outs[pick], [&] { return r.export_safetensors(it.stage.path(), o); });
    total.raw_bytes += st.raw_bytes;
    total.file_bytes += st.file_bytes;
    done[pick] = true;
  }
  staged.publish_all(opt.force);
  return total;
}

PassStats rebase(const std::string& in, const std::string& out, const WriteOptions& opt, const ReadOptions& ropt) {
  Reader r(in, ropt.threads);
  if (!ropt.refs.empty()) r.add_reference_paths(ropt.refs);
  r.check_references();
  check_not_same_file(in, out);
  // The original safetensors file is rebuilt beside the output, then
  // compressed again without references (casts within the file are kept).
  if (opt.output_fd < 0) (void)check_file_target(out, opt.force);  // refused before the work, not after
  const Temporary tmp = Temporary::reserve(out);  // removed on every path
  ReadOptions ro = ropt;
  ro.force = false;
  ro.output_fd = -1;
  ro.progress = nullptr;
  r.export_safetensors(tmp.path(), ro);
  WriteOptions o = opt;
  o.ref.clear();
  const PassStats st = compress_file(tmp.path(), out, o);
  return PassStats{r.original_size(), st.file_bytes};
}

}  // namespace tz::container

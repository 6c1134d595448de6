// tzip plan: cost model of checkpoint saves with and without compression.
// See plan.hpp for the units (the time model of one save: src/checkpoint/codec_choice.hpp).
#include "plan.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "tensorzip/container.hpp"
#include "tensorzip/tensorzip.h"

namespace tz::checkpoint {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kTiB = kGiB * 1024.0;
constexpr double kHoursPerMonth = 8760.0 / 12.0;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
}  // namespace

std::vector<PlanPart> model_parts(double params, bool master, unsigned grad_bytes_per_param) {
  const auto n = [&](double bytes_per_param) { return (uint64_t)std::llround(params * bytes_per_param); };
  std::vector<PlanPart> p;
  p.push_back({"weights", "BF16", n(2), 1, 1});
  if (master) p.push_back({"master weights", "F32", n(4), 1, 1});
  p.push_back({"Adam m", "F32", n(4), 1, 1});
  p.push_back({"Adam v", "F32", n(4), 1, 1});
  if (grad_bytes_per_param == 2) p.push_back({"gradients", "BF16", n(2), 1, 1});
  if (grad_bytes_per_param == 4) p.push_back({"gradients", "F32", n(4), 1, 1});
  return p;
}

// Default figures. Source: `tzip bench -T 2 --levels 1,2` on
// /work/shared/fixtures/gpt-small-step400-{model-bf16,optim-fp32}.safetensors
// (the real GPT checkpoint of the test fixtures), 2-core development VM:
//   BF16 weights   ratio 1.513 (level 1), 1.514 (level 2)
//   FP32 optimizer ratio 1.219 (level 1), 1.219 (level 2)  (master, m and v together)
// Speed: doc/container.md section 11 (Measurements), in-memory `tzip bench -T 2 --levels 1`:
//   0.66 GB/s compress, 1.46 GB/s decompress with 2 CPU threads. Level 2
//   relative to level 1 from the same `tzip bench --levels 1,2` runs above
//   (loaded machine, so only the ratio of the two is used): compress 0.93x
//   (0.13/0.14 BF16, 0.16/0.17 FP32), decompress 0.83x (0.38/0.46 on FP32,
//   the bulk of a checkpoint). These are CPU figures for 2 threads per
//   rank; a GPU encoder or more threads is faster: use --measure or
//   --compress-gbps for your machine.
// Gradients have no measurement in this repository: ratio 1.0 (no gain
// claimed) unless --ratio-grads is given.
void apply_default_codec_figures(PlanInput& in) {
  for (auto& p : in.parts) {
    if (p.label == "gradients") continue;
    if (p.dtype == "BF16") p.ratio_fast = 1.513, p.ratio_strong = 1.514;
    else if (p.dtype == "F32") p.ratio_fast = 1.219, p.ratio_strong = 1.219;
  }
  in.fast = {0.66e9 / kGiB, 1.46e9 / kGiB};
  in.strong = {in.fast.compress_gibps * 0.93, in.fast.decompress_gibps * 0.83};
  in.sources.push_back(
      "codec defaults: ratios from `tzip bench -T 2 --levels 1,2` on the fixture GPT checkpoint (BF16 1.513/1.514, "
      "FP32 optimizer 1.219/1.219); speed 0.66 GB/s compress, 1.46 GB/s decompress per rank (2 CPU threads, "
      "doc/container.md section 11, Measurements), level 2 at 0.93x / 0.83x of that; gradients ratio 1.0 (not measured)");
}

PlanResult plan(const PlanInput& in) {
  PlanResult r;
  double comp_fast = 0, comp_strong = 0;
  for (const auto& p : in.parts) {
    r.raw_bytes += p.bytes;
    comp_fast += p.bytes / std::max(p.ratio_fast, 1e-9);
    comp_strong += p.bytes / std::max(p.ratio_strong, 1e-9);
  }
  const double S = (double)r.raw_bytes;
  const double rf = comp_fast > 0 ? S / comp_fast : 1, rs = comp_strong > 0 ? S / comp_strong : 1;
  const double g = std::max(1u, in.gpus);
  r.choice = choose_codec(S, in.storage_gibps, in.fast.compress_gibps * g, rf, in.strong.compress_gibps * g, rs,
                          in.have_forced ? &in.forced : nullptr);
  double dec = 0;
  switch (r.choice.kind) {
    case CodecKind::kFast: r.comp_bytes = comp_fast, r.ratio = rf, dec = in.fast.decompress_gibps; break;
    case CodecKind::kStrong: r.comp_bytes = comp_strong, r.ratio = rs, dec = in.strong.decompress_gibps; break;
    default: r.comp_bytes = S, r.ratio = 1; break;
  }
  const double t_chosen = r.choice.kind == CodecKind::kFast     ? r.choice.t_fast_s
                          : r.choice.kind == CodecKind::kStrong ? r.choice.t_strong_s
                                                                : r.choice.t_raw_s;
  r.sync_stall_raw_s = r.choice.t_raw_s;
  r.sync_stall_comp_s = t_chosen;
  // Async: training stops only for the snapshot (device -> host copy, all
  // GPUs in parallel), plus any part of the background save that overruns
  // the interval (the next save has to wait for it).
  const double snap = S / (g * in.snapshot_gibps * kGiB);
  const double interval_s = in.interval_min * 60;
  r.async_stall_raw_s = snap + std::max(0.0, r.choice.t_raw_s - interval_s);
  r.async_stall_comp_s = snap + std::max(0.0, t_chosen - interval_s);
  const double B = in.storage_gibps * kGiB;
  r.restore_raw_s = S / B;
  r.restore_comp_s = r.choice.kind == CodecKind::kRaw ? r.restore_raw_s
                                                       : pipelined_seconds(S, B, dec * g * kGiB, r.ratio);
  r.checkpoints_per_month = in.interval_min > 0 ? kHoursPerMonth * 60 / in.interval_min : 0;
  r.gpu_hours_saved_sync = r.checkpoints_per_month * (r.sync_stall_raw_s - r.sync_stall_comp_s) * g / 3600;
  r.usd_saved_sync = r.gpu_hours_saved_sync * in.usd_per_gpu_hour;
  r.gpu_hours_saved_async = r.checkpoints_per_month * (r.async_stall_raw_s - r.async_stall_comp_s) * g / 3600;
  r.usd_saved_async = r.gpu_hours_saved_async * in.usd_per_gpu_hour;
  r.storage_saved_tib = (S - r.comp_bytes) * in.retained / kTiB;
  r.usd_storage_saved = r.storage_saved_tib * in.usd_per_tib_month;
  return r;
}

std::string plan_report(const PlanInput& in, const PlanResult& r) {
  std::string o;
  auto line = [&](const std::string& s) { o += s + "\n"; };
  line("checkpoint parts:");
  for (const auto& p : in.parts)
    line("  " + p.label + " (" + p.dtype + ")" + std::string(std::max<int>(1, 26 - (int)p.label.size() - (int)p.dtype.size()), ' ') +
         fmt("%10.2f GiB", p.bytes / kGiB) + fmt("   ratio fast %.4f", p.ratio_fast) +
         fmt(", strong %.4f", p.ratio_strong));
  line(fmt("setting: %.0f GPUs", in.gpus) + fmt(", $%.2f/GPU-hour", in.usd_per_gpu_hour) +
       fmt(", checkpoint every %.1f min", in.interval_min) + fmt(", storage %.2f GiB/s", in.storage_gibps) +
       fmt(" and $%.2f/TiB-month", in.usd_per_tib_month) + fmt(", %.0f checkpoints kept", in.retained));
  line(fmt("codec per GPU rank: fast %.3f GiB/s", in.fast.compress_gibps) +
       fmt(" encode / %.3f decode", in.fast.decompress_gibps) +
       fmt("; strong %.3f encode", in.strong.compress_gibps) + fmt(" / %.3f decode", in.strong.decompress_gibps));
  for (const auto& s : in.sources) line("source: " + s);
  line("time model: " + r.choice.model);
  line("");
  line(fmt("checkpoint size        raw %10.2f GiB", r.raw_bytes / kGiB) +
       fmt("   compressed %10.2f GiB", r.comp_bytes / kGiB) + fmt("  (ratio %.4f, codec ", r.ratio) +
       codec_kind_name(r.choice.kind) + ")");
  line(fmt("stall per save (sync)  raw %10.1f s  ", r.sync_stall_raw_s) +
       fmt("   compressed %10.1f s", r.sync_stall_comp_s));
  line(fmt("stall per save (async) raw %10.1f s  ", r.async_stall_raw_s) +
       fmt("   compressed %10.1f s", r.async_stall_comp_s) +
       fmt("  (snapshot at %.1f GiB/s per GPU", in.snapshot_gibps) + " + overrun of the interval)");
  line(fmt("restore                raw %10.1f s  ", r.restore_raw_s) + fmt("   compressed %10.1f s", r.restore_comp_s));
  line(fmt("per month (%.0f checkpoints):", r.checkpoints_per_month));
  line(fmt("  sync saves:  %.1f GPU-hours", r.gpu_hours_saved_sync) + fmt(" = $%.0f saved", r.usd_saved_sync));
  line(fmt("  async saves: %.1f GPU-hours", r.gpu_hours_saved_async) + fmt(" = $%.0f saved", r.usd_saved_async));
  line(fmt("  storage:     %.3f TiB less", r.storage_saved_tib) + fmt(" = $%.0f saved", r.usd_storage_saved));
  return o;
}

std::string plan_json(const PlanInput& in, const PlanResult& r) {
  using nlohmann::json;
  json parts = json::array();
  for (const auto& p : in.parts)
    parts.push_back({{"label", p.label}, {"dtype", p.dtype}, {"bytes", p.bytes}, {"ratio_fast", p.ratio_fast},
                     {"ratio_strong", p.ratio_strong}});
  json j = {
      {"units", {{"size", "GiB = 2^30 bytes"}, {"bandwidth", "GiB/s"}, {"month_hours", kHoursPerMonth}}},
      {"input",
       {{"parts", parts},
        {"gpus", in.gpus},
        {"usd_per_gpu_hour", in.usd_per_gpu_hour},
        {"interval_min", in.interval_min},
        {"storage_gibps", in.storage_gibps},
        {"usd_per_tib_month", in.usd_per_tib_month},
        {"retained", in.retained},
        {"snapshot_gibps_per_gpu", in.snapshot_gibps},
        {"fast", {{"compress_gibps", in.fast.compress_gibps}, {"decompress_gibps", in.fast.decompress_gibps}}},
        {"strong", {{"compress_gibps", in.strong.compress_gibps}, {"decompress_gibps", in.strong.decompress_gibps}}},
        {"sources", in.sources}}},
      {"codec", codec_kind_name(r.choice.kind)},
      {"time_model", r.choice.model},
      {"t_raw_s", r.choice.t_raw_s},
      {"t_fast_s", std::isfinite(r.choice.t_fast_s) ? json(r.choice.t_fast_s) : json(nullptr)},
      {"t_strong_s", std::isfinite(r.choice.t_strong_s) ? json(r.choice.t_strong_s) : json(nullptr)},
      {"raw_bytes", r.raw_bytes},
      {"compressed_bytes", r.comp_bytes},
      {"raw_gib", r.raw_bytes / kGiB},
      {"compressed_gib", r.comp_bytes / kGiB},
      {"ratio", r.ratio},
      {"sync_stall_raw_s", r.sync_stall_raw_s},
      {"sync_stall_compressed_s", r.sync_stall_comp_s},
      {"async_stall_raw_s", r.async_stall_raw_s},
      {"async_stall_compressed_s", r.async_stall_comp_s},
      {"restore_raw_s", r.restore_raw_s},
      {"restore_compressed_s", r.restore_comp_s},
      {"checkpoints_per_month", r.checkpoints_per_month},
      {"gpu_hours_saved_per_month_sync", r.gpu_hours_saved_sync},
      {"usd_saved_per_month_sync", r.usd_saved_sync},
      {"gpu_hours_saved_per_month_async", r.gpu_hours_saved_async},
      {"usd_saved_per_month_async", r.usd_saved_async},
      {"storage_saved_tib", r.storage_saved_tib},
      {"usd_storage_saved_per_month", r.usd_storage_saved}};
  return j.dump(2) + "\n";
}

// ---- measuring a checkpoint -------------------------------------------------
namespace {

namespace fs = std::filesystem;

std::string role_of(const std::string& name) {
  if (name.find("exp_avg_sq") != std::string::npos) return "Adam v";
  if (name.find("exp_avg") != std::string::npos) return "Adam m";
  if (name.find("master") != std::string::npos) return "master weights";
  if (name.find("grad") != std::string::npos) return "gradients";
  return "weights";
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

std::vector<std::string> checkpoint_files(const std::string& path) {
  std::vector<std::string> out;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::recursive_directory_iterator(path, fs::directory_options::follow_directory_symlink))
      if (e.is_regular_file() &&
          (ends_with(e.path().string(), ".safetensors") || ends_with(e.path().string(), ".tzip")))
        out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
  } else {
    out.push_back(path);
  }
  if (out.empty()) throw std::runtime_error(path + ": no .safetensors or .tzip file");
  return out;
}

// A tensor to measure: file, name, dtype and where to get its bytes.
struct TensorRef {
  std::string file;
  std::string name;
  std::string dtype;
  uint64_t offset = 0;  // absolute in a safetensors file
  uint64_t size = 0;
  bool tzip = false;
};

template <class F>
void for_each_tensor(const std::string& path, F&& f) {
  for (const auto& file : checkpoint_files(path)) {
    if (ends_with(file, ".tzip")) {
      tz::container::Reader rd(file, 1);
      for (const auto& t : rd.tensors()) f(TensorRef{file, t.name, t.dtype, 0, t.raw_size(), true}, &t);
    } else {
      const auto st = tz::container::read_safetensors_info(file);
      for (const auto& t : st.tensors)
        f(TensorRef{file, t.name, t.dtype, st.data_start + t.data_begin, t.raw_size(), false}, nullptr);
    }
  }
}

std::string part_key(const TensorRef& t) { return role_of(t.name) + "\x1f" + t.dtype; }

}  // namespace

std::vector<PlanPart> parts_from_checkpoint(const std::string& path, bool* had_tzip) {
  std::map<std::string, PlanPart> by;
  std::map<std::string, double> comp;
  bool any_tzip = false, all_tzip = true;
  for_each_tensor(path, [&](const TensorRef& t, const tz::container::TensorEntry* e) {
    auto& p = by[part_key(t)];
    p.label = role_of(t.name);
    p.dtype = t.dtype;
    p.bytes += t.size;
    if (e) comp[part_key(t)] += (double)e->compressed_size(), any_tzip = true;
    else all_tzip = false;
  });
  std::vector<PlanPart> out;
  for (auto& [k, p] : by) {
    if (any_tzip && all_tzip && comp[k] > 0) p.ratio_fast = p.ratio_strong = p.bytes / comp[k];
    out.push_back(p);
  }
  if (had_tzip) *had_tzip = any_tzip && all_tzip;
  return out;
}

void measure_codec(const std::string& path, PlanInput& in, unsigned threads, uint64_t max_bytes) {
  struct Acc {
    uint64_t raw = 0;
    double comp[2] = {0, 0};
  };
  std::map<std::string, Acc> acc;
  double t_enc[2] = {0, 0}, t_dec[2] = {0, 0};
  uint64_t total = 0;
  std::unique_ptr<tz_ctx, void (*)(tz_ctx*)> ctx(tz_ctx_create(threads), &tz_ctx_free);
  if (!ctx) throw std::runtime_error("cannot create a tensorzip context");
  constexpr size_t kChunk = 4u << 20;  // as the save pipeline cuts tensors
  std::vector<uint8_t> raw(kChunk), comp(tz_compress_bound(kChunk)), back(kChunk);
  for_each_tensor(path, [&](const TensorRef& t, const tz::container::TensorEntry*) {
    auto& a = acc[part_key(t)];
    if (a.raw >= max_bytes) return;
    tz_dtype cd = TZ_DTYPE_BYTES;
    tz::container::codec_dtype_for(t.dtype, &cd);
    std::vector<uint8_t> whole;
    if (t.tzip) {
      tz::container::Reader rd(t.file, 1);
      whole = rd.read_tensor(t.name);
    }
    int fd = t.tzip ? -1 : ::open(t.file.c_str(), O_RDONLY | O_CLOEXEC);
    if (!t.tzip && fd < 0) throw std::runtime_error(t.file + ": cannot open");
    for (uint64_t off = 0; off < t.size && a.raw < max_bytes; off += kChunk) {
      const size_t n = (size_t)std::min<uint64_t>(kChunk, t.size - off);
      if (t.tzip) std::memcpy(raw.data(), whole.data() + off, n);
      else if (::pread(fd, raw.data(), n, (off_t)(t.offset + off)) != (ssize_t)n) {
        ::close(fd);
        throw std::runtime_error(t.file + ": short read");
      }
      for (int l = 0; l < 2; ++l) {
        tz_params p{};
        p.dtype = cd;
        p.level = l + 1;
        auto t0 = std::chrono::steady_clock::now();
        const size_t c = tz_ctx_compress(ctx.get(), comp.data(), comp.size(), raw.data(), n, &p);
        auto t1 = std::chrono::steady_clock::now();
        if (tz_is_error(c)) throw std::runtime_error(std::string("compress: ") + tz_get_error_name(c));
        const size_t d = tz_ctx_decompress(ctx.get(), back.data(), back.size(), comp.data(), c);
        auto t2 = std::chrono::steady_clock::now();
        if (tz_is_error(d) || d != n) throw std::runtime_error("decompress failed while measuring");
        t_enc[l] += std::chrono::duration<double>(t1 - t0).count();
        t_dec[l] += std::chrono::duration<double>(t2 - t1).count();
        a.comp[l] += (double)c;
      }
      a.raw += n;
      total += n;
    }
    if (fd >= 0) ::close(fd);
  });
  for (auto& p : in.parts) {
    const auto it = acc.find(p.label + "\x1f" + p.dtype);
    if (it == acc.end() || it->second.raw == 0) continue;
    p.ratio_fast = it->second.raw / it->second.comp[0];
    p.ratio_strong = it->second.raw / it->second.comp[1];
  }
  if (total > 0) {
    in.fast = {total / t_enc[0] / kGiB, total / t_dec[0] / kGiB};
    in.strong = {total / t_enc[1] / kGiB, total / t_dec[1] / kGiB};
  }
  in.sources.push_back("measured on " + path + ": " + fmt("%.1f MiB", total / 1048576.0) + " in 4 MiB chunks, " +
                       std::to_string(tz_ctx_threads(ctx.get())) + " thread(s) of this machine, levels 1 and 2");
}

}  // namespace tz::checkpoint

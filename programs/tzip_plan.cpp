// `tzip plan`: what compression saves on checkpoints, in seconds, GPU-hours
// and dollars per month (cost model in programs/plan.hpp,
// doc/checkpoint.md). Called from tzip.cpp's main.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

#include "plan.hpp"

namespace {

using namespace tz::checkpoint;

const char* kPlanHelp =
    "usage: tzip plan (--params N | --checkpoint PATH) [options]\n"
    "\n"
    "Estimates checkpoint size, save stall (sync and async), restore time, and the GPU-hours,\n"
    "dollars and storage that compression saves per month. Sizes are GiB (2^30 bytes) and\n"
    "bandwidths GiB/s; a month is 730 hours. The codec (raw / fast = level 1 / strong = level 2)\n"
    "is chosen so that a save is never slower than writing raw bytes; the time model is printed.\n"
    "\n"
    "model:\n"
    "  --params N             parameters (70e9, 70B, 7.5b ...): BF16 weights + FP32 Adam m and v\n"
    "  --master               add FP32 master weights (4 bytes/parameter)\n"
    "  --grads none|bf16|fp32 gradients in the checkpoint (default bf16)\n"
    "  --checkpoint PATH      instead of --params: sizes by dtype from a .safetensors/.tzip file or\n"
    "                         folder (a .tzip also gives its measured ratio)\n"
    "  --measure              compress up to --max-mib per part of the checkpoint at levels 1 and 2\n"
    "                         with -T threads on this machine: ratios and per-rank speeds\n"
    "  --max-mib N            data per part for --measure (default 256)\n"
    "  -T, --threads N        threads for --measure (default: all cores)\n"
    "cluster:\n"
    "  --gpus N               GPUs (= writer ranks) (default 64)\n"
    "  --gpu-hour USD         $ per GPU-hour (default 2.00)\n"
    "  --interval MIN         minutes between checkpoints (default 30)\n"
    "  --bandwidth GIBPS      aggregate storage bandwidth, GiB/s (default 5)\n"
    "  --tb-month USD         $ per TiB-month of storage (default 20)\n"
    "  --retained N           checkpoints kept on storage (default 3)\n"
    "  --snapshot GIBPS       device->host copy per GPU for async saves (default 20)\n"
    "codec (per GPU rank; default figures and their source are printed):\n"
    "  --compress-gbps X      encode speed, GB/s (10^9) of raw bytes, both levels\n"
    "  --decompress-gbps X    decode speed, GB/s\n"
    "  --ratio-weights R, --ratio-optim R, --ratio-grads R   ratio of those parts, both levels\n"
    "  --codec auto|raw|fast|strong   override the choice (default auto)\n"
    "  --json                 one JSON object instead of the report\n";

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double parse_num(const std::string& opt, const std::string& v, double lo, double hi) {
  std::string s = v;
  double mul = 1;
  if (!s.empty()) {
    const char c = s.back();
    if (c == 'B' || c == 'b') mul = 1e9, s.pop_back();
    else if (c == 'M' || c == 'm') mul = 1e6, s.pop_back();
    else if (c == 'T' || c == 't') mul = 1e12, s.pop_back();
  }
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(s.c_str(), &end) * mul;
  if (s.empty() || *end || errno || !std::isfinite(x) || x < lo || x > hi)
    throw Usage("option " + opt + ": bad value '" + v + "'");
  return x;
}

}  // namespace

int tzip_plan_main(int argc, char** argv) {
  try {
    PlanInput in;
    double params = 0;
    bool master = false, measure = false, json = false;
    unsigned grads = 2, threads = 0;
    uint64_t max_mib = 256;
    std::string ckpt, codec = "auto";
    double c_gbps = 0, d_gbps = 0, r_w = 0, r_o = 0, r_g = 0;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto val = [&]() -> std::string {
        if (i + 1 >= argc) throw Usage("option " + a + " needs a value");
        return argv[++i];
      };
      if (a == "-h" || a == "--help") {
        std::fputs(kPlanHelp, stdout);
        return 0;
      } else if (a == "--params") params = parse_num(a, val(), 1, 1e16);
      else if (a == "--master") master = true;
      else if (a == "--grads") {
        const std::string g = val();
        if (g == "none") grads = 0;
        else if (g == "bf16") grads = 2;
        else if (g == "fp32") grads = 4;
        else throw Usage("--grads takes none, bf16 or fp32");
      } else if (a == "--checkpoint") ckpt = val();
      else if (a == "--measure") measure = true;
      else if (a == "--max-mib") max_mib = (uint64_t)parse_num(a, val(), 1, 1 << 20);
      else if (a == "-T" || a == "--threads") threads = (unsigned)parse_num(a, val(), 1, 4096);
      else if (a == "--gpus") in.gpus = (unsigned)parse_num(a, val(), 1, 1e7);
      else if (a == "--gpu-hour") in.usd_per_gpu_hour = parse_num(a, val(), 0, 1e6);
      else if (a == "--interval") in.interval_min = parse_num(a, val(), 1e-3, 1e7);
      else if (a == "--bandwidth") in.storage_gibps = parse_num(a, val(), 1e-6, 1e9);
      else if (a == "--tb-month") in.usd_per_tib_month = parse_num(a, val(), 0, 1e9);
      else if (a == "--retained") in.retained = (unsigned)parse_num(a, val(), 0, 1e6);
      else if (a == "--snapshot") in.snapshot_gibps = parse_num(a, val(), 1e-6, 1e9);
      else if (a == "--compress-gbps") c_gbps = parse_num(a, val(), 1e-9, 1e9);
      else if (a == "--decompress-gbps") d_gbps = parse_num(a, val(), 1e-9, 1e9);
      else if (a == "--ratio-weights") r_w = parse_num(a, val(), 0.01, 1e6);
      else if (a == "--ratio-optim") r_o = parse_num(a, val(), 0.01, 1e6);
      else if (a == "--ratio-grads") r_g = parse_num(a, val(), 0.01, 1e6);
      else if (a == "--codec") {
        codec = val();
        if (codec == "raw") in.have_forced = true, in.forced = CodecKind::kRaw;
        else if (codec == "fast") in.have_forced = true, in.forced = CodecKind::kFast;
        else if (codec == "strong") in.have_forced = true, in.forced = CodecKind::kStrong;
        else if (codec != "auto") throw Usage("--codec takes auto, raw, fast or strong");
      } else if (a == "--json") json = true;
      else throw Usage("unknown option '" + a + "' for 'plan' (try 'tzip plan --help')");
    }
    if ((params > 0) == !ckpt.empty()) throw Usage("plan: give exactly one of --params or --checkpoint");
    if (measure && ckpt.empty()) throw Usage("plan: --measure needs --checkpoint");
    bool tzip_ratios = false;
    if (params > 0) in.parts = model_parts(params, master, grads);
    else in.parts = parts_from_checkpoint(ckpt, &tzip_ratios);
    // Defaults first, then what was measured, then what was given.
    std::vector<PlanPart> measured_parts = in.parts;
    apply_default_codec_figures(in);
    if (tzip_ratios) {
      for (size_t k = 0; k < in.parts.size(); ++k) in.parts[k] = measured_parts[k];
      in.sources.push_back("ratios: measured in the .tzip file(s) of " + ckpt);
    }
    if (measure) measure_codec(ckpt, in, threads, max_mib << 20);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (c_gbps > 0) in.fast.compress_gibps = in.strong.compress_gibps = c_gbps * 1e9 / gib;
    if (d_gbps > 0) in.fast.decompress_gibps = in.strong.decompress_gibps = d_gbps * 1e9 / gib;
    for (auto& p : in.parts) {
      const bool optim = p.label == "Adam m" || p.label == "Adam v" || p.label == "master weights";
      const double r = p.label == "weights" ? r_w : p.label == "gradients" ? r_g : optim ? r_o : 0;
      if (r > 0) p.ratio_fast = p.ratio_strong = r;
    }
    if (c_gbps > 0 || d_gbps > 0 || r_w > 0 || r_o > 0 || r_g > 0) in.sources.push_back("command-line codec figures");
    const PlanResult r = plan(in);
    std::fputs(json ? plan_json(in, r).c_str() : plan_report(in, r).c_str(), stdout);
    return 0;
  } catch (const Usage& e) {
    std::fprintf(stderr, "tzip: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tzip: plan: %s\n", e.what());
    return 2;
  }
}

// Deterministic codec driver for instruction counts (valgrind --tool=callgrind)
// and quick timings: compresses every tensor of one data kind of the fixture
// checkpoint with a 1-thread context, then decompresses them, checking the
// round trip. Prints the SIMD path in use (TZ_SIMD forces one).
//
//   build/bench/tz_codec_count bf16w 3
//   TZ_LEVEL=2 build/bench/tz_codec_count adam_v      (level; default 0, the default level)
//   TZ_PER_TENSOR=1 build/bench/tz_codec_count master  (also: name, raw and frame bytes of each tensor)
//   TZ_FRAME_FLAGS=3 build/bench/tz_codec_count adam_m  (the header flags the encoder may use: 3 = all
//                                                       but zero elision, doc/format.md 5.10; default all)
//   TZ_COMPRESS_ONLY=1 perf record build/bench/tz_codec_count adam_v 20  (compress passes only: no decompress
//                                                                  timing, no round-trip check)
//   TZ_SIMD=avx2 valgrind --tool=callgrind --toggle-collect=tz_ctx_decompress build/bench/tz_codec_count bf16w
//
// Kinds: bf16w (BF16 weights), master, adam_m, adam_v (FP32, step 400), or
// FILE.safetensors:DTYPE for the tensors of one dtype of any file (DTYPE as
// safetensors spells it: BF16, F16, F32, F8_E4M3, F8_E5M2).
// Valgrind does not run AVX-512: under it the CPU reports no AVX-512, so the
// best path it can count is avx2.
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu/frame.h"
#include "tensorzip/tensorzip.h"

#ifndef TZ_BENCH_FIXTURES_DIR
#define TZ_BENCH_FIXTURES_DIR "../shared/fixtures"
#endif

namespace {

struct Tensor {
  std::string name;
  std::vector<uint8_t> data;
};

std::vector<Tensor> load(const std::string& kind, tz_dtype* dt) {
  const char* env = std::getenv("TZ_FIXTURES");
  const std::string dir = env && *env ? env : TZ_BENCH_FIXTURES_DIR;
  std::string file, prefix, want;
  if (kind == "bf16w") {
    file = "gpt-small-step400-model-bf16.safetensors", want = "BF16", *dt = TZ_DTYPE_BF16;
  } else if (kind == "master" || kind == "adam_m" || kind == "adam_v") {
    file = "gpt-small-step400-optim-fp32.safetensors", want = "F32", *dt = TZ_DTYPE_F32;
    prefix = kind == "master" ? "master." : kind == "adam_m" ? "exp_avg." : "exp_avg_sq.";
  } else if (const size_t colon = kind.rfind(':'); colon != std::string::npos) {
    // FILE.safetensors:DTYPE (BF16, F16, F32, F8_E4M3, F8_E5M2): every tensor of that dtype in the file.
    file = kind.substr(0, colon), want = kind.substr(colon + 1);
    *dt = want == "BF16" ? TZ_DTYPE_BF16 : want == "F16" ? TZ_DTYPE_F16 : want == "F32" ? TZ_DTYPE_F32
        : want == "F8_E4M3" ? TZ_DTYPE_F8_E4M3 : want == "F8_E5M2" ? TZ_DTYPE_F8_E5M2 : TZ_DTYPE_BYTES;
    if (*dt == TZ_DTYPE_BYTES) {
      std::fprintf(stderr, "unknown dtype %s in %s\n", want.c_str(), kind.c_str());
      std::exit(2);
    }
  } else {
    std::fprintf(stderr, "unknown kind %s (bf16w, master, adam_m, adam_v, FILE.safetensors:DTYPE)\n", kind.c_str());
    std::exit(2);
  }
  if (file.find('/') == std::string::npos) file = dir + "/" + file;
  std::ifstream f(file, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot open %s (set TZ_FIXTURES)\n", file.c_str());
    std::exit(2);
  }
  uint8_t len8[8];
  f.read((char*)len8, 8);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = hlen << 8 | len8[i];
  std::string header(hlen, '\0');
  f.read(header.data(), (std::streamsize)hlen);
  const std::vector<uint8_t> body((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<Tensor> out;
  const nlohmann::json j = nlohmann::json::parse(header);
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__" || v["dtype"] != want || name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t b = v["data_offsets"][0], e = v["data_offsets"][1];
    out.push_back({name, std::vector<uint8_t>(body.begin() + (ptrdiff_t)b, body.begin() + (ptrdiff_t)e)});
  }
  return out;
}

// Process CPU time: on a shared machine, time lost to other jobs is not
// counted (the 1-thread context runs on the calling thread).
double now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s KIND [REPS]\n", argv[0]);
    return 2;
  }
  const int reps = argc > 2 ? std::atoi(argv[2]) : 1;
  if (const char* fl = std::getenv("TZ_FRAME_FLAGS")) tz::cpu::set_encoder_flags_mask((uint8_t)std::atoi(fl));
  const char* level_env = std::getenv("TZ_LEVEL");
  const int level = level_env && *level_env ? std::atoi(level_env) : 0;
  const char* be_env = std::getenv("TZ_BLOCK_ELEMS");  // 0 / unset: the codec's default
  const unsigned block_elems = be_env && *be_env ? (unsigned)std::atoi(be_env) : 0u;
  tz_dtype dt;
  const std::vector<Tensor> ts = load(argv[1], &dt);
  tz_ctx* ctx = tz_ctx_create(1);
  size_t raw = 0, packed = 0;
  // Buffers allocated and touched once, outside the timed loops.
  std::vector<std::vector<uint8_t>> comp(ts.size());
  std::vector<size_t> comp_size(ts.size());
  size_t largest = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    comp[i].resize(tz_compress_bound(ts[i].data.size()));
    largest = std::max(largest, ts[i].data.size());
  }
  std::vector<uint8_t> back(largest);
  double tc = 1e30, td = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    packed = 0;
    for (size_t i = 0; i < ts.size(); ++i) {
      const tz_params p{dt, level, block_elems, 1};
      const size_t n = tz_ctx_compress(ctx, comp[i].data(), comp[i].size(), ts[i].data.data(), ts[i].data.size(), &p);
      if (tz_is_error(n)) {
        std::fprintf(stderr, "%s: %s\n", ts[i].name.c_str(), tz_last_error_detail());
        return 1;
      }
      comp_size[i] = n;
      packed += n;
      if (r == 0 && std::getenv("TZ_PER_TENSOR"))
        std::printf("%s %zu %zu\n", ts[i].name.c_str(), ts[i].data.size(), n);
    }
    tc = std::min(tc, now() - t0);
  }
  const bool compress_only = std::getenv("TZ_COMPRESS_ONLY") && *std::getenv("TZ_COMPRESS_ONLY") == '1';
  for (int r = 0; r < (compress_only ? 0 : reps); ++r) {
    const double t0 = now();
    for (size_t i = 0; i < ts.size(); ++i) {
      const size_t n = tz_ctx_decompress(ctx, back.data(), ts[i].data.size(), comp[i].data(), comp_size[i]);
      if (tz_is_error(n) || n != ts[i].data.size()) {
        std::fprintf(stderr, "%s: %s\n", ts[i].name.c_str(), tz_last_error_detail());
        return 1;
      }
    }
    td = std::min(td, now() - t0);
  }
  for (size_t i = 0; i < (compress_only ? 0 : ts.size()); ++i) {  // the round trip, outside the timing
    const size_t n = tz_ctx_decompress(ctx, back.data(), ts[i].data.size(), comp[i].data(), comp_size[i]);
    if (tz_is_error(n) || std::memcmp(back.data(), ts[i].data.data(), n) != 0) {
      std::fprintf(stderr, "%s: round trip failed\n", ts[i].name.c_str());
      return 1;
    }
  }
  raw = 0;
  for (const auto& t : ts) raw += t.data.size();
  std::printf("path %s: %s, level %d, %zu tensors, %zu -> %zu bytes (ratio %.4f); best of %d: compress %.3f GB/s, ",
              tz_simd_path(), argv[1], level, ts.size(), raw, packed, (double)raw / (double)packed, reps, raw / tc / 1e9);
  if (compress_only)
    std::printf("decompress not run (CPU time, 1 thread)\n");
  else
    std::printf("decompress %.3f GB/s (CPU time, 1 thread)\n", raw / td / 1e9);
  tz_ctx_free(ctx);
  return 0;
}

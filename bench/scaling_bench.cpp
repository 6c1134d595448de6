// Thread scaling of the codec on one large input: compresses and
// decompresses FILE (raw bytes of one dtype) with 1..N threads through a
// reused tz_ctx, best of R runs, wall time, and checks the round trip and
// that the compressed bytes are identical for every thread count.
//
//   tz_scaling_bench FILE DTYPE(bf16|f16|f32|f8_e4m3|f8_e5m2|bytes) [MAX_THREADS] [RUNS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "tensorzip/tensorzip.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s FILE DTYPE [MAX_THREADS] [RUNS]\n", argv[0]);
    return 1;
  }
  std::ifstream f(argv[1], std::ios::binary);
  if (!f) {
    fprintf(stderr, "%s: cannot open\n", argv[1]);
    return 2;
  }
  const std::vector<char> in((std::istreambuf_iterator<char>(f)), {});
  const std::string dt = argv[2];
  tz_params p{};
  const char* names[] = {"bytes", "bf16", "f16", "f32", "f8_e4m3", "f8_e5m2"};
  int found = -1;
  for (int i = 0; i < 6; ++i)
    if (dt == names[i]) found = i;
  if (found < 0) {
    fprintf(stderr, "unknown dtype %s\n", dt.c_str());
    return 1;
  }
  p.dtype = (tz_dtype)found;
  const unsigned max_t = argc > 3 ? (unsigned)atoi(argv[3]) : std::max(1u, std::thread::hardware_concurrency());
  const int runs = argc > 4 ? atoi(argv[4]) : 5;
  std::vector<char> c(tz_compress_bound(in.size())), d(in.size()), first;
  printf("%s: %zu bytes, dtype %s\n", argv[1], in.size(), dt.c_str());
  printf("threads  ratio    compress GB/s  decompress GB/s\n");
  for (unsigned t = 1; t <= max_t; ++t) {
    tz_ctx* ctx = tz_ctx_create(t);
    double tc = 1e30, td = 1e30;
    size_t cs = 0;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      cs = tz_ctx_compress(ctx, c.data(), c.size(), in.data(), in.size(), &p);
      const auto t1 = std::chrono::steady_clock::now();
      const size_t ds = tz_ctx_decompress(ctx, d.data(), d.size(), c.data(), cs);
      const auto t2 = std::chrono::steady_clock::now();
      if (tz_is_error(cs) || tz_is_error(ds) || memcmp(in.data(), d.data(), in.size()) != 0) {
        fprintf(stderr, "round trip failed: %s\n", tz_last_error_detail());
        return 2;
      }
      tc = std::min(tc, std::chrono::duration<double>(t1 - t0).count());
      td = std::min(td, std::chrono::duration<double>(t2 - t1).count());
    }
    if (first.empty()) first.assign(c.begin(), c.begin() + cs);
    else if (cs != first.size() || memcmp(first.data(), c.data(), cs) != 0) {
      fprintf(stderr, "compressed bytes differ with %u threads\n", t);
      return 2;
    }
    printf("%7u  %.4f  %13.2f  %15.2f\n", t, (double)in.size() / cs, in.size() / tc / 1e9, in.size() / td / 1e9);
    tz_ctx_free(ctx);
  }
  return 0;
}

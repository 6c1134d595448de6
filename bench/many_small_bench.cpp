// Many small tensors through TensorWriter and Reader::read_tensors (the
// paths of Python save_file / load_file / safe_open), for callgrind counts
// and thread A/B runs (bench/experiments/notebook.md, "Tiny frames and small-tensor
// grouping").
//   tz_many_small_bench write OUT.tzip THREADS
//     20,000 tensors of 1-400 elements (BF16 from the fixture model file's
//     bytes, every fifth constant, every seventh I16) and four of 700,000
//     elements, through TensorWriter (OUT is replaced).
//   tz_many_small_bench read FILE.tzip THREADS
//     opens FILE and reads every tensor with one read_tensors call.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tensorzip/container.hpp"

namespace tc = tz::container;

namespace {

int write_many(const char* out, unsigned threads) {
  const char* fixture = std::getenv("TZ_FIXTURE_BF16");
  const std::string path = fixture ? fixture : TZ_BENCH_FIXTURES_DIR "/gpt-small-step200-model-bf16.safetensors";
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> pool(8u << 20);
  f.seekg(1 << 20);
  f.read(reinterpret_cast<char*>(pool.data()), (std::streamsize)pool.size());
  if (!f) {
    std::fprintf(stderr, "%s: cannot read 9 MiB (set TZ_FIXTURE_BF16)\n", path.c_str());
    return 1;
  }
  tc::TensorWriterOptions o;
  o.threads = threads;
  o.force = true;
  tc::TensorWriter w(out, o);
  std::mt19937 rng(5);
  size_t at = 0;
  std::vector<std::vector<uint8_t>> keep;
  for (int i = 0; i < 20000; ++i) {
    size_t n = 1 + rng() % 400;
    if (i % 5000 == 7) n = 700000;
    if (at + 2 * n > pool.size()) at = 0;
    keep.emplace_back(pool.begin() + (long)at, pool.begin() + (long)(at + 2 * n));
    at += 2 * n;
    if (i % 5 == 0) std::fill(keep.back().begin(), keep.back().end(), 0);
    w.add("t" + std::to_string(i), i % 7 == 0 ? "I16" : "BF16", {n}, keep.back().data(), keep.back().size());
  }
  w.finish();
  return 0;
}

int read_all(const char* file, unsigned threads) {
  tc::Reader r(file, 1);
  const size_t n = r.tensors().size();
  std::vector<std::vector<uint8_t>> out(n);
  std::vector<tc::Reader::TensorRead> reads;
  for (size_t i = 0; i < n; ++i) {
    out[i].resize(r.tensors()[i].raw_size());
    reads.push_back({i, out[i].data(), out[i].size()});
  }
  r.read_tensors(reads, threads);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[1], "write") && std::strcmp(argv[1], "read"))) {
    std::fprintf(stderr, "usage: tz_many_small_bench write OUT.tzip THREADS | read FILE.tzip THREADS\n");
    return 2;
  }
  const unsigned threads = (unsigned)std::atoi(argv[3]);
  try {
    return std::strcmp(argv[1], "write") == 0 ? write_many(argv[2], threads) : read_all(argv[2], threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tz_many_small_bench: %s\n", e.what());
    return 1;
  }
}

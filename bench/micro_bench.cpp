// Per-block micro benchmark (Google Benchmark) on the real checkpoint of
// ../shared/fixtures: BF16 model weights and the FP32 master weights, Adam m
// and Adam v of step 400.
//
// Two families:
//   Kernel*  the portable per-block code of src/codec (encode_block /
//            decode_block: what a GPU thread or a CPU worker runs per block),
//            with tables built from each tensor's histogram at level 1;
//   Lib*     the library as shipped (C ABI, one thread, so whatever SIMD path
//            the CPU backend picks): one block at a time through
//            tz_ctx_decompress_blocks, and whole tensors through
//            tz_ctx_compress / tz_ctx_decompress. The path is printed first;
//            TZ_SIMD=portable|avx2|avx512|neon forces one.
// Only tensors holding at least one full block contribute (full blocks only
// for Kernel* and LibDecodeBlock). Throughput is of uncompressed bytes.
//
//   build-bench/bench/tz_micro_bench --benchmark_min_time=0.2
//   TZ_FIXTURES=/path/to/fixtures build-bench/bench/tz_micro_bench --benchmark_filter=Kernel
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/block.h"
#include "codec/cost.h"
#include "cpu/checksum_cpu.h"
#include "tensorzip/tensorzip.h"

#ifndef TZ_BENCH_FIXTURES_DIR
#define TZ_BENCH_FIXTURES_DIR "../shared/fixtures"
#endif

namespace {

// ------------------------------------------------------- safetensors read --

struct TensorRef {
  std::string name, dtype;
  size_t begin = 0, end = 0;  // offsets into the data section
};

// Just enough JSON for a safetensors header: an object of objects holding
// strings, numbers and arrays of numbers (plus the string-only __metadata__).
class MiniJson {
 public:
  explicit MiniJson(const std::string& s) : s_(s) {}

  std::vector<TensorRef> parse_header() {
    std::vector<TensorRef> out;
    expect('{');
    if (peek() == '}') return out;
    for (;;) {
      const std::string key = str();
      expect(':');
      TensorRef t;
      t.name = key;
      expect('{');
      if (peek() != '}') {
        for (;;) {
          const std::string field = str();
          expect(':');
          if (field == "dtype") {
            t.dtype = str();
          } else if (field == "data_offsets") {
            expect('[');
            t.begin = (size_t)num();
            expect(',');
            t.end = (size_t)num();
            expect(']');
          } else {
            skip_value();
          }
          if (peek() == ',') { ++i_; continue; }
          break;
        }
      }
      expect('}');
      if (key != "__metadata__") out.push_back(t);
      if (peek() == ',') { ++i_; continue; }
      break;
    }
    expect('}');
    return out;
  }

 private:
  char peek() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
    if (i_ >= s_.size()) throw std::runtime_error("safetensors header: unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) throw std::runtime_error(std::string("safetensors header: expected '") + c + "'");
    ++i_;
  }
  std::string str() {
    expect('"');
    std::string r;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') {
        ++i_;  // keep escaped char as is (\uXXXX left verbatim: names here are ASCII)
        if (i_ >= s_.size()) break;
      }
      r += s_[i_++];
    }
    expect('"');
    return r;
  }
  double num() {
    peek();
    size_t used = 0;
    const double v = std::stod(s_.substr(i_, 32), &used);
    i_ += used;
    return v;
  }
  void skip_value() {
    const char c = peek();
    if (c == '"') { str(); return; }
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i_;
      if (peek() == close) { ++i_; return; }
      for (;;) {
        if (c == '{') { str(); expect(':'); }
        skip_value();
        if (peek() == ',') { ++i_; continue; }
        expect(close);
        return;
      }
    }
    while (i_ < s_.size() && s_[i_] != ',' && s_[i_] != '}' && s_[i_] != ']') ++i_;  // number, true, null
  }
  const std::string& s_;
  size_t i_ = 0;
};

struct SafeTensorsFile {
  std::vector<uint8_t> data;  // the data section
  std::vector<TensorRef> tensors;
};

SafeTensorsFile read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path + " (set TZ_FIXTURES to the fixture folder)");
  uint8_t len8[8];
  f.read((char*)len8, 8);
  const uint64_t hlen = tz::load_le64(len8);
  if (!f || hlen > (1u << 26)) throw std::runtime_error(path + ": bad safetensors header length");
  std::string header(hlen, '\0');
  f.read(header.data(), (std::streamsize)hlen);
  SafeTensorsFile st;
  st.tensors = MiniJson(header).parse_header();
  st.data.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  for (const auto& t : st.tensors)
    if (t.begin > t.end || t.end > st.data.size()) throw std::runtime_error(path + ": tensor outside the file");
  return st;
}

std::string fixtures_dir() {
  const char* e = std::getenv("TZ_FIXTURES");
  return e && *e ? e : TZ_BENCH_FIXTURES_DIR;
}

// A data set: contiguous real tensors of one dtype.
struct DataSet {
  uint8_t dtype = tz::kBytes;
  std::vector<std::vector<uint8_t>> tensors;
};

const DataSet& data_set(const std::string& name) {
  static std::map<std::string, DataSet> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  DataSet ds;
  const std::string dir = fixtures_dir();
  std::string file, prefix, want;
  if (name == "bf16_weights") {
    file = "gpt-small-step400-model-bf16.safetensors", want = "BF16", ds.dtype = tz::kBF16;
  } else {
    file = "gpt-small-step400-optim-fp32.safetensors", want = "F32", ds.dtype = tz::kF32;
    prefix = name == "f32_master" ? "master." : name == "adam_m" ? "exp_avg." : "exp_avg_sq.";
  }
  const SafeTensorsFile st = read_safetensors(dir + "/" + file);
  for (const auto& t : st.tensors) {
    if (t.dtype != want || t.name.compare(0, prefix.size(), prefix) != 0) continue;
    ds.tensors.emplace_back(st.data.begin() + (ptrdiff_t)t.begin, st.data.begin() + (ptrdiff_t)t.end);
  }
  if (ds.tensors.empty()) throw std::runtime_error("no tensors for data set " + name);
  return cache.emplace(name, std::move(ds)).first->second;
}

// ------------------------------------------------------ per-block kernels --

struct Tables {
  tz::BlockEncTables et{};
  tz::BlockDecTables dt{};
  std::vector<tz::RansEncSym> enc = std::vector<tz::RansEncSym>(tz::kMaxStreams * 256);
  std::vector<uint32_t> dec = std::vector<uint32_t>(tz::kMaxStreams * tz::kProbScale);
};

struct Block {
  const uint8_t* src;
  uint32_t n;
  uint32_t crc;
  const Tables* tab;
  std::vector<uint8_t> enc;
};

struct BlockCorpus {
  uint8_t dtype;
  uint32_t block_elems;
  std::vector<std::unique_ptr<Tables>> tables;
  std::vector<Block> blocks;
  size_t raw_bytes = 0, enc_bytes = 0;
};

// Tables as the level-1 encoder builds them: whole-tensor histogram per field
// stream, rANS where it saves >= 1% (stream_pays).
std::unique_ptr<Tables> build_tables(uint8_t dtype, const uint8_t* src, uint32_t n, uint32_t block_elems) {
  auto tb = std::make_unique<Tables>();
  const int K = tz::dtype_stream_count(dtype);
  std::vector<uint8_t> planes((size_t)K * n);
  uint8_t* streams[tz::kMaxStreams] = {};
  for (int k = 0; k < K; ++k) streams[k] = planes.data() + (size_t)k * n;
  tz::split_fields(dtype, src, n, streams);
  const uint64_t n_blocks = tz::frame_n_blocks(n, block_elems);
  for (int k = 0; k < K; ++k) {
    uint64_t counts[256] = {};
    for (uint32_t i = 0; i < n; ++i) ++counts[streams[k][i]];
    uint32_t freq[256];
    if (tz::rans_normalize(counts, freq) == 0) continue;
    uint8_t tbuf[tz::kFreqTableMaxBytes];
    const size_t tbytes = tz::rans_write_table(freq, tbuf);
    if (!tz::stream_pays(1, tz::coded_stream_bytes(counts, freq, n_blocks, tbytes), n)) continue;
    tb->et.kind[k] = tb->dt.kind[k] = tz::kKindRans;
    tz::rans_build_enc(freq, tb->enc.data() + (size_t)k * 256);
    tz::rans_build_dec(freq, tb->dec.data() + (size_t)k * tz::kProbScale);
    tb->et.enc[k] = tb->enc.data() + (size_t)k * 256;
    tb->dt.dec[k] = tb->dec.data() + (size_t)k * tz::kProbScale;
  }
  return tb;
}

const BlockCorpus& block_corpus(const std::string& set, uint32_t block_elems) {
  static std::map<std::pair<std::string, uint32_t>, BlockCorpus> cache;
  const auto key = std::make_pair(set, block_elems);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const DataSet& ds = data_set(set);
  BlockCorpus bc;
  bc.dtype = ds.dtype;
  bc.block_elems = block_elems;
  const uint32_t es = tz::dtype_elem_size(ds.dtype);
  const int K = tz::dtype_stream_count(ds.dtype);
  std::vector<uint8_t> scratch(tz::block_scratch_size(block_elems, K));
  std::vector<uint8_t> check((size_t)block_elems * es);
  for (const auto& t : ds.tensors) {
    const uint32_t n = (uint32_t)(t.size() / es);
    if (n < block_elems) continue;
    bc.tables.push_back(build_tables(ds.dtype, t.data(), n, block_elems));
    const Tables* tab = bc.tables.back().get();
    for (uint32_t b = 0; (uint64_t)(b + 1) * block_elems <= n; ++b) {
      Block blk{t.data() + (size_t)b * block_elems * es, block_elems, 0, tab, {}};
      blk.crc = tz::cpu::block_checksum(blk.src, (size_t)block_elems * es);
      blk.enc.resize(tz::block_bound(block_elems, K));
      blk.enc.resize(tz::encode_block(ds.dtype, tab->et, blk.src, block_elems, blk.crc, scratch.data(),
                                      blk.enc.data()));
      uint32_t stored = 0;
      if (tz::decode_block(ds.dtype, tab->dt, blk.enc.data(), blk.enc.size(), block_elems, scratch.data(),
                           check.data(), &stored) != tz::kOk ||
          stored != blk.crc || memcmp(check.data(), blk.src, check.size()) != 0)
        throw std::runtime_error("kernel round trip failed on " + set);
      bc.raw_bytes += (size_t)block_elems * es;
      bc.enc_bytes += blk.enc.size();
      bc.blocks.push_back(std::move(blk));
    }
  }
  return cache.emplace(key, std::move(bc)).first->second;
}

bool skip_if_empty(benchmark::State& state, size_t raw) {
  if (raw) return false;
  state.SkipWithError("no tensor holds a full block of this size");
  return true;
}

void BM_KernelEncode(benchmark::State& state, const std::string& set) {
  const BlockCorpus& bc = block_corpus(set, (uint32_t)state.range(0));
  if (skip_if_empty(state, bc.raw_bytes)) return;
  const int K = tz::dtype_stream_count(bc.dtype);
  std::vector<uint8_t> scratch(tz::block_scratch_size(bc.block_elems, K));
  std::vector<uint8_t> out(tz::block_bound(bc.block_elems, K));
  for (auto _ : state) {
    for (const Block& b : bc.blocks) {
      const size_t sz = tz::encode_block(bc.dtype, b.tab->et, b.src, b.n, b.crc, scratch.data(), out.data());
      benchmark::DoNotOptimize(sz);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)bc.raw_bytes);
  state.counters["ratio"] = (double)bc.raw_bytes / (double)bc.enc_bytes;
  state.counters["blocks"] = (double)bc.blocks.size();
}

void BM_KernelDecode(benchmark::State& state, const std::string& set) {
  const BlockCorpus& bc = block_corpus(set, (uint32_t)state.range(0));
  if (skip_if_empty(state, bc.raw_bytes)) return;
  const int K = tz::dtype_stream_count(bc.dtype);
  std::vector<uint8_t> scratch(tz::block_scratch_size(bc.block_elems, K));
  std::vector<uint8_t> out((size_t)bc.block_elems * tz::dtype_elem_size(bc.dtype));
  for (auto _ : state) {
    for (const Block& b : bc.blocks) {
      uint32_t stored;
      const int st =
          tz::decode_block(bc.dtype, b.tab->dt, b.enc.data(), b.enc.size(), b.n, scratch.data(), out.data(), &stored);
      if (st != tz::kOk) {
        state.SkipWithError("decode_block failed");
        return;
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)bc.raw_bytes);
  state.counters["ratio"] = (double)bc.raw_bytes / (double)bc.enc_bytes;
}

void BM_BlockChecksum(benchmark::State& state, const std::string& set) {
  const BlockCorpus& bc = block_corpus(set, (uint32_t)state.range(0));
  if (skip_if_empty(state, bc.raw_bytes)) return;
  const uint32_t es = tz::dtype_elem_size(bc.dtype);
  for (auto _ : state)
    for (const Block& b : bc.blocks) benchmark::DoNotOptimize(tz::cpu::block_checksum(b.src, (size_t)b.n * es));
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)bc.raw_bytes);
}

// ------------------------------------------------------ library (C ABI) --

tz_dtype public_dtype(uint8_t d) { return (tz_dtype)d; }

struct FrameCorpus {
  std::vector<const std::vector<uint8_t>*> raw;
  std::vector<std::vector<uint8_t>> frames;
  size_t raw_bytes = 0, enc_bytes = 0;
};

struct CtxDeleter {
  void operator()(tz_ctx* c) const { tz_ctx_free(c); }
};
using CtxPtr = std::unique_ptr<tz_ctx, CtxDeleter>;

const FrameCorpus& frame_corpus(const std::string& set, uint32_t block_elems) {
  static std::map<std::pair<std::string, uint32_t>, FrameCorpus> cache;
  const auto key = std::make_pair(set, block_elems);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const DataSet& ds = data_set(set);
  CtxPtr ctx(tz_ctx_create(1));
  tz_params p{};
  p.dtype = public_dtype(ds.dtype);
  p.block_elems = block_elems;
  FrameCorpus fc;
  const uint32_t es = tz::dtype_elem_size(ds.dtype);
  for (const auto& t : ds.tensors) {
    if (t.size() / es < block_elems) continue;
    std::vector<uint8_t> f(tz_compress_bound(t.size()));
    const size_t r = tz_ctx_compress(ctx.get(), f.data(), f.size(), t.data(), t.size(), &p);
    if (tz_is_error(r)) throw std::runtime_error(std::string("tz_ctx_compress: ") + tz_last_error_detail());
    f.resize(r);
    fc.raw.push_back(&t);
    fc.raw_bytes += t.size();
    fc.enc_bytes += r;
    fc.frames.push_back(std::move(f));
  }
  return cache.emplace(key, std::move(fc)).first->second;
}

void BM_LibCompress(benchmark::State& state, const std::string& set) {
  const FrameCorpus& fc = frame_corpus(set, (uint32_t)state.range(0));
  if (skip_if_empty(state, fc.raw_bytes)) return;
  CtxPtr ctx(tz_ctx_create(1));
  tz_params p{};
  p.dtype = public_dtype(data_set(set).dtype);
  p.block_elems = (unsigned)state.range(0);
  size_t cap = 0;
  for (auto* r : fc.raw) cap = std::max(cap, tz_compress_bound(r->size()));
  std::vector<uint8_t> out(cap);
  for (auto _ : state) {
    for (auto* r : fc.raw) {
      const size_t sz = tz_ctx_compress(ctx.get(), out.data(), out.size(), r->data(), r->size(), &p);
      if (tz_is_error(sz)) {
        state.SkipWithError("tz_ctx_compress failed");
        return;
      }
    }
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)fc.raw_bytes);
  state.counters["ratio"] = (double)fc.raw_bytes / (double)fc.enc_bytes;
}

void BM_LibDecompress(benchmark::State& state, const std::string& set) {
  const FrameCorpus& fc = frame_corpus(set, (uint32_t)state.range(0));
  if (skip_if_empty(state, fc.raw_bytes)) return;
  CtxPtr ctx(tz_ctx_create(1));
  size_t cap = 0;
  for (auto* r : fc.raw) cap = std::max(cap, r->size());
  std::vector<uint8_t> out(cap);
  for (size_t i = 0; i < fc.frames.size(); ++i) {  // verify once
    const size_t r = tz_ctx_decompress(ctx.get(), out.data(), out.size(), fc.frames[i].data(), fc.frames[i].size());
    if (tz_is_error(r) || r != fc.raw[i]->size() || memcmp(out.data(), fc.raw[i]->data(), r) != 0) {
      state.SkipWithError("library round trip failed");
      return;
    }
  }
  for (auto _ : state) {
    for (const auto& f : fc.frames) {
      const size_t r = tz_ctx_decompress(ctx.get(), out.data(), out.size(), f.data(), f.size());
      if (tz_is_error(r)) {
        state.SkipWithError("tz_ctx_decompress failed");
        return;
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)fc.raw_bytes);
  state.counters["ratio"] = (double)fc.raw_bytes / (double)fc.enc_bytes;
}

// One block per call through tz_ctx_decompress_blocks: includes parsing the
// frame prefix and building the decode tables on every call, as random
// access to a single block pays.
void BM_LibDecodeBlock(benchmark::State& state, const std::string& set) {
  const uint32_t be = (uint32_t)state.range(0);
  const FrameCorpus& fc = frame_corpus(set, be);
  if (skip_if_empty(state, fc.raw_bytes)) return;
  struct One {
    const uint8_t* prefix;
    size_t prefix_size;
    const uint8_t* blk;
    size_t blk_size;
    unsigned index;
  };
  std::vector<One> ones;
  size_t raw = 0;
  const uint32_t es = tz::dtype_elem_size(data_set(set).dtype);
  for (const auto& f : fc.frames) {
    tz_frame_info info{};
    if (tz_is_error(tz_frame_inspect(f.data(), f.size(), &info))) {
      state.SkipWithError("tz_frame_inspect failed");
      return;
    }
    for (unsigned b = 0; b < info.n_blocks; ++b) {
      uint64_t off, size, roff, rsize;
      tz_frame_block_range(f.data(), info.prefix_size, b, 1, &off, &size, &roff, &rsize);
      if (rsize != (uint64_t)be * es) continue;  // full blocks only
      ones.push_back({f.data(), (size_t)info.prefix_size, f.data() + off, (size_t)size, b});
      raw += rsize;
    }
  }
  CtxPtr ctx(tz_ctx_create(1));
  std::vector<uint8_t> out((size_t)be * es);
  for (auto _ : state) {
    for (const One& o : ones) {
      const size_t r = tz_ctx_decompress_blocks(ctx.get(), out.data(), out.size(), o.prefix, o.prefix_size, o.blk,
                                                o.blk_size, o.index, 1);
      if (tz_is_error(r)) {
        state.SkipWithError("tz_ctx_decompress_blocks failed");
        return;
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed((int64_t)state.iterations() * (int64_t)raw);
  state.counters["blocks"] = (double)ones.size();
}

}  // namespace

int main(int argc, char** argv) {
  const char* sets[] = {"bf16_weights", "f32_master", "adam_m", "adam_v"};
  struct Fn {
    const char* name;
    void (*fn)(benchmark::State&, const std::string&);
  } fns[] = {{"KernelEncode", BM_KernelEncode},     {"KernelDecode", BM_KernelDecode},
             {"BlockChecksum", BM_BlockChecksum},   {"LibCompress", BM_LibCompress},
             {"LibDecompress", BM_LibDecompress},   {"LibDecodeBlock", BM_LibDecodeBlock}};
  for (const auto& f : fns)
    for (const char* s : sets) {
      const std::string set = s;
      auto fn = f.fn;
      benchmark::RegisterBenchmark((std::string(f.name) + "/" + set).c_str(),
                                   [fn, set](benchmark::State& st) { fn(st, set); })
          ->ArgName("block_elems")
          ->Arg(1 << 14)
          ->Arg(1 << 16)
          ->Arg(1 << 18)
          ->Unit(benchmark::kMillisecond);
    }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The Lib* rows run the CPU backend's kernel set (TZ_SIMD forces one); the
  // Kernel* rows are always the portable per-block code.
  benchmark::AddCustomContext("tensorzip SIMD path (Lib* rows)", tz_simd_path());
  std::printf("tensorzip SIMD path (Lib* rows): %s\n", tz_simd_path());
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tz_micro_bench: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}

// KV page codec benchmark driver (bench/kv_bench.py runs it and prints the
// table of bench/experiments/notebook.md). Every method codes the same pages, one page per
// call, in one process:
//   kv-rans, kv-fixed (code width from the sample), kv-fixed4 (4 bits):
//       the page codec with one codec per group (layer x K/V), each CPU
//       kernel set this machine has (portable, avx2, avx512, neon);
//   frame:  tz_ctx_compress / tz_ctx_decompress of each page (the .tzip frame
//       codec, level 1, its own tables and headers per page);
//   zstd-1: ZSTD_compressCCtx level 1 / ZSTD_decompressDCtx per page;
//   raw:    memcpy.
// Input: a folder with g<i>.sample and g<i>.data (raw little-endian
// elements of one dtype; the sample calibrates, the data is cut into pages).
// Timing: each repetition runs every method once (interleaved), per-method
// median of the repetitions; `threads` workers each code a contiguous share
// of the pages. Every round trip is checked byte for byte.
//
//   tz_kv_bench DIR DTYPE ROW_ELEMS TOKENS THREADS [REPS [HOT_BYTES]]
// prints one JSON object per method and direction on stdout. HOT_BYTES > 0:
// only the first HOT_BYTES of pages (from every group in turn), each timing
// running over them as often as makes ~24 MB, so that the pages and buffers
// stay in the caches (the default streams every page from memory once).
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <time.h>
#include <vector>

#include "kv/codec.hpp"
#include "tensorzip/tensorzip.h"

namespace {

using Bytes = std::vector<uint8_t>;
using tz::kv::Codec;

Bytes read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return {};
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct Page {
  const uint8_t* src;
  size_t size;
  int group;
  Bytes enc;      // encoded
  size_t enc_size = 0;
  Bytes out;      // decoded
};

// Method: encode(page, worker) fills page.enc / enc_size; decode(page, worker) fills page.out.
// A batch method (enc_n / dec_n set) codes runs of up to kBatchPages pages of one group per
// call instead, as an engine hands over the blocks it moves (Codec::encode_batch / decode_batch,
// one thread): each page is still read from memory once.
constexpr size_t kBatchPages = 32;
using BatchFn = std::function<void(Page*, size_t, unsigned)>;
struct Method {
  std::string name, path;
  std::function<void(Page&, unsigned)> enc, dec;
  BatchFn enc_n, dec_n;
  std::vector<double> t_enc, t_dec;
  size_t coded = 0;
};

// Pages [a, b) in runs of one group, at most kBatchPages each.
void for_runs(std::vector<Page>& pages, size_t a, size_t b, unsigned w, const BatchFn& f) {
  while (a < b) {
    size_t e = a + 1;
    while (e < b && e - a < kBatchPages && pages[e].group == pages[a].group) ++e;
    f(&pages[a], e - a, w);
    a = e;
  }
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// One thread: CPU time of the calling thread (what a core spends, whatever
// else runs on a shared machine); more threads: wall time. With fn (a batch
// method) runs of pages per call.
double run(std::vector<Page>& pages, unsigned threads, const std::function<void(Page&, unsigned)>& f,
           const BatchFn& fn = {}) {
  if (threads <= 1) {
    const double c0 = thread_cpu_seconds();
    if (fn)
      for_runs(pages, 0, pages.size(), 0, fn);
    else
      for (Page& p : pages) f(p, 0);
    return thread_cpu_seconds() - c0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::thread> th;
    for (unsigned w = 0; w < threads; ++w)
      th.emplace_back([&, w] {
        const size_t a = pages.size() * w / threads, b = pages.size() * (w + 1) / threads;
        if (fn)
          for_runs(pages, a, b, w, fn);
        else
          for (size_t i = a; i < b; ++i) f(pages[i], w);
      });
    for (auto& t : th) t.join();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s DIR DTYPE(bf16|f16|f8_e4m3|f8_e5m2) ROW_ELEMS TOKENS THREADS [REPS]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1], dts = argv[2];
  const uint8_t dtype = dts == "bf16" ? tz::kBF16 : dts == "f16" ? tz::kF16 : dts == "f8_e4m3" ? tz::kF8E4M3 : tz::kF8E5M2;
  const size_t es = tz::dtype_elem_size(dtype);
  const size_t page_bytes = (size_t)std::atoi(argv[3]) * std::atoi(argv[4]) * es;
  const unsigned threads = (unsigned)std::max(1, std::atoi(argv[5]));
  const int reps = argc > 6 ? std::atoi(argv[6]) : 5;
  const size_t hot = argc > 7 ? (size_t)std::atoll(argv[7]) : 0;

  std::vector<Bytes> samples, datas;
  for (int g = 0;; ++g) {
    Bytes s = read_file(dir + "/g" + std::to_string(g) + ".sample");
    Bytes d = read_file(dir + "/g" + std::to_string(g) + ".data");
    if (s.empty() || d.empty()) break;
    samples.push_back(std::move(s));
    datas.push_back(std::move(d));
  }
  if (samples.empty()) {
    std::fprintf(stderr, "%s: no g0.sample / g0.data\n", dir.c_str());
    return 2;
  }
  std::vector<Page> pages;
  for (size_t g = 0; g < datas.size(); ++g)
    for (size_t off = 0; off + page_bytes <= datas[g].size(); off += page_bytes)
      pages.push_back(Page{datas[g].data() + off, page_bytes, (int)g, Bytes(), 0, Bytes(page_bytes)});
  if (hot) {  // pages of every group, round robin, up to HOT_BYTES
    std::vector<Page> pick;
    const size_t want = std::max<size_t>(1, hot / page_bytes);
    for (size_t k = 0; pick.size() < want && k < pages.size(); ++k) {
      const size_t per = pages.size() / datas.size(), g = k % datas.size(), j = k / datas.size();
      if (j < per) pick.push_back(pages[g * per + j]);
    }
    pages.swap(pick);
  }
  size_t raw_total = 0;
  for (const Page& p : pages) raw_total += p.size;
  const int passes = hot ? (int)std::max<size_t>(1, (24u << 20) / raw_total) : 1;

  std::vector<Method> methods;
  std::vector<std::vector<std::unique_ptr<Codec>>> codecs;  // [variant][group]
  struct Variant {
    const char* name;
    tz_kv_params p;
  };
  std::vector<Variant> variants = {{"kv-rans", {}}, {"kv-fixed", {}}, {"kv-fixed4", {}}, {"kv-rans-nocrc", {}},
                                   {"kv-fixed-nocrc", {}}};
  variants[1].p.mode = TZ_KV_MODE_FIXED;
  variants[2].p.mode = TZ_KV_MODE_FIXED;
  variants[2].p.fixed_bits = 4;
  variants[3].p.no_checksum = 1;
  variants[4].p.mode = TZ_KV_MODE_FIXED;
  variants[4].p.no_checksum = 1;
  for (const Variant& v : variants) {
    codecs.emplace_back();
    for (size_t g = 0; g < samples.size(); ++g) {
      std::unique_ptr<Codec> c;
      if (Codec::calibrate(&c, samples[g].data(), samples[g].size(), dtype, v.p) != 0) {
        std::fprintf(stderr, "calibration failed: %s\n", tz_last_error_detail());
        return 1;
      }
      codecs.back().push_back(std::move(c));
    }
  }
  std::vector<std::vector<uint8_t>> scratch(threads);
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    for (tz::cpu::SimdPath sp : tz::cpu::kAllSimdPaths) {
      const tz::kv::PageKernels* k = tz::kv::page_kernels(sp);
      if (!k) continue;
      // Variants without checksums: the fastest path only (they differ from
      // the checksummed ones by the CRC alone).
      if (vi >= 3 && sp != tz::cpu::best_simd_path() && sp != tz::cpu::SimdPath::kAvx2) continue;
      auto* cs = &codecs[vi];
      Method m;
      m.name = variants[vi].name;
      m.path = tz::cpu::simd_path_name(sp);
      m.enc = [cs, k](Page& p, unsigned) {
        const Codec& c = *(*cs)[p.group];
        if (p.enc.size() < c.page_bound(p.size)) p.enc.resize(c.page_bound(p.size));
        p.enc_size = c.encode(*k, p.enc.data(), p.enc.size(), p.src, p.size);
      };
      m.dec = [cs, k](Page& p, unsigned) {
        (*cs)[p.group]->decode(*k, p.out.data(), p.out.size(), p.enc.data(), p.enc_size);
      };
      methods.push_back(std::move(m));
      // Batches of the checksummed modes on the SIMD kernel sets.
      if (vi >= 3 || sp == tz::cpu::SimdPath::kPortable) continue;
      Method b;
      b.name = std::string(variants[vi].name) + "-batch";
      b.path = tz::cpu::simd_path_name(sp);
      b.enc_n = [cs, k](Page* p, size_t cnt, unsigned) {
        const Codec& c = *(*cs)[p->group];
        thread_local std::vector<tz_kv_item> items;
        items.resize(cnt);
        for (size_t i = 0; i < cnt; ++i) {
          if (p[i].enc.size() < c.page_bound(p[i].size)) p[i].enc.resize(c.page_bound(p[i].size));
          items[i] = tz_kv_item{p[i].src, p[i].size, p[i].enc.data(), p[i].enc.size(), 0};
        }
        c.encode_batch(*k, items.data(), cnt, 1);
        for (size_t i = 0; i < cnt; ++i) p[i].enc_size = items[i].result;
      };
      b.dec_n = [cs, k](Page* p, size_t cnt, unsigned) {
        const Codec& c = *(*cs)[p->group];
        thread_local std::vector<tz_kv_item> items;
        items.resize(cnt);
        for (size_t i = 0; i < cnt; ++i) items[i] = tz_kv_item{p[i].enc.data(), p[i].enc_size, p[i].out.data(), p[i].out.size(), 0};
        c.decode_batch(*k, items.data(), cnt, 1);
      };
      methods.push_back(std::move(b));
    }
  }
  {
    std::vector<tz_ctx*> ctx(threads);
    for (auto& c : ctx) c = tz_ctx_create(1);
    Method m;
    m.name = "frame";
    m.path = tz_simd_path();
    m.enc = [ctx, dtype](Page& p, unsigned w) {
      tz_params prm{};
      prm.dtype = (tz_dtype)dtype;
      if (p.enc.size() < tz_compress_bound(p.size)) p.enc.resize(tz_compress_bound(p.size));
      p.enc_size = tz_ctx_compress(ctx[w], p.enc.data(), p.enc.size(), p.src, p.size, &prm);
    };
    m.dec = [ctx](Page& p, unsigned w) { tz_ctx_decompress(ctx[w], p.out.data(), p.out.size(), p.enc.data(), p.enc_size); };
    methods.push_back(std::move(m));
  }
  {
    std::vector<ZSTD_CCtx*> cc(threads);
    std::vector<ZSTD_DCtx*> dc(threads);
    for (auto& c : cc) c = ZSTD_createCCtx();
    for (auto& d : dc) d = ZSTD_createDCtx();
    Method m;
    m.name = "zstd-1";
    m.path = "libzstd";
    m.enc = [cc](Page& p, unsigned w) {
      if (p.enc.size() < ZSTD_compressBound(p.size)) p.enc.resize(ZSTD_compressBound(p.size));
      p.enc_size = ZSTD_compressCCtx(cc[w], p.enc.data(), p.enc.size(), p.src, p.size, 1);
    };
    m.dec = [dc](Page& p, unsigned w) { ZSTD_decompressDCtx(dc[w], p.out.data(), p.out.size(), p.enc.data(), p.enc_size); };
    methods.push_back(std::move(m));
  }
  {
    Method m;
    m.name = "raw";
    m.path = "memcpy";
    m.enc = [](Page& p, unsigned) {
      if (p.enc.size() < p.size) p.enc.resize(p.size);
      memcpy(p.enc.data(), p.src, p.size);
      p.enc_size = p.size;
    };
    m.dec = [](Page& p, unsigned) { memcpy(p.out.data(), p.enc.data(), p.enc_size); };
    methods.push_back(std::move(m));
  }

  for (int r = 0; r < reps; ++r) {
    for (Method& m : methods) {
      double te = 0;
      for (int k = 0; k < passes; ++k) te += run(pages, threads, m.enc, m.enc_n);
      m.t_enc.push_back(te / passes);
      size_t coded = 0;
      for (Page& p : pages) {
        if (tz_is_error(p.enc_size) || ZSTD_isError(p.enc_size)) {
          std::fprintf(stderr, "%s/%s: encode failed\n", m.name.c_str(), m.path.c_str());
          return 1;
        }
        coded += p.enc_size;
        std::fill(p.out.begin(), p.out.end(), 0);
      }
      m.coded = coded;
      double td = 0;
      for (int k = 0; k < passes; ++k) td += run(pages, threads, m.dec, m.dec_n);
      m.t_dec.push_back(td / passes);
      for (Page& p : pages)
        if (memcmp(p.out.data(), p.src, p.size) != 0) {
          std::fprintf(stderr, "%s/%s: round trip differs\n", m.name.c_str(), m.path.c_str());
          return 1;
        }
    }
  }
  for (const Method& m : methods)
    std::printf(
        "{\"method\": \"%s\", \"path\": \"%s\", \"tokens\": %d, \"threads\": %u, \"pages\": %zu, \"raw_bytes\": %zu, "
        "\"coded_bytes\": %zu, \"ratio\": %.4f, \"enc_gbps\": %.3f, \"dec_gbps\": %.3f, \"reps\": %d, \"hot_bytes\": %zu}\n",
        m.name.c_str(), m.path.c_str(), std::atoi(argv[4]), threads, pages.size(), raw_total, m.coded,
        (double)raw_total / (double)m.coded, raw_total / median(m.t_enc) / 1e9, raw_total / median(m.t_dec) / 1e9,
        reps, hot);
  return 0;
}

// Decode cost of stream-1 tables chosen by the same element's exponent
// ("slope contexts", bench/experiments/notebook.md, the version-3 model study), measured
// before any format change. Stream 1 (BF16 / FP32 sign|mantissa-high byte)
// of each 64 Ki-element block of real data is coded with 32 interleaved rANS
// lanes in the library's payload layout (doc/format.md section 5), each
// symbol with the table of its context: the exponent (stream 0, already
// decoded) at the same position. Contexts as the model maps them, per block:
// every exponent value with >= 64 symbols in the block its own table, the
// rest one shared table. Variants, all on the same blocks and path:
//   o0    one table per block (today's order-0 stream 1)
//   ctx   the real per-exponent contexts, table = tables + ctx[i] * 4096 with
//         ctx[] a byte array made from the exponents beforehand ("map")
//   lut   the same contexts, the kernel reading the exponent bytes and
//         looking their table offsets up (a 256-entry LUT) itself
//   q8/q4 the contexts quantised into 8 / 4 shared tables (ctx form)
// Every decoded stream is compared with the input; the tables of each
// block sit at their own addresses (as a decoder's table sets do). CPU time
// of each variant over all blocks, the variants interleaved round by round;
// medians, converted to cycles at --ghz (default 2.596, the development VM's
// TSC rate). Three passes (Pass): "decode" with tables built long before,
// "build+decode" building each block's tables right before decoding it, and
// "hot" (each block decoded twice, the second timed). "build" is the cost
// of building a block's decode tables (rans_build_dec per table) alone,
// "map" that of making the context bytes from the exponents, per symbol.
//
//   build/bench/tz_ctx_decode_bench [--ghz G] [--rounds R] [--max-blocks B]
//       [--path portable|avx2] [--kind bf16|master|adam_m] [--fixtures DIR]
//       [--decode-only]
//
// Under callgrind (--rounds 1 --decode-only), the decoders are the
// functions ctxbench_decode_{portable,avx2}_{one,ctx,lut} (each called once
// per variant: _ctx three times, for ctx, q8 and q4);
// callgrind_annotate --inclusive=yes gives their instructions.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "codec/fields.h"
#include "codec/rans.h"
#include "cpu/simd_path.h"
#include "ctx_decode_kernels.h"
#include "fixture_blocks.h"

#ifndef TZ_BENCH_FIXTURES_DIR
#define TZ_BENCH_FIXTURES_DIR "../shared/fixtures"
#endif

using namespace tz;
using namespace tz::ctxbench;
using namespace tz::experiments;

namespace {

constexpr uint32_t kBlock = kFixtureBlock;
constexpr uint32_t kMinOwn = 64;  // symbols an exponent needs for its own table

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// -------------------------------------------------------------- model --

// One block's contexts: ctx_of[e] for every exponent e, and n tables.
struct CtxMap {
  uint8_t ctx_of[256];
  uint32_t n;
  bool rest;  // the last table is the shared one of the rare exponents
};

// The model's contexts (bench/experiments/model_study.py slope_ctx_cost, per block):
// exponents with >= kMinOwn symbols own a table, in increasing exponent
// order; the others share the last one.
CtxMap exponent_contexts(const uint8_t* e, uint32_t n) {
  uint32_t h[256] = {};
  for (uint32_t i = 0; i < n; ++i) ++h[e[i]];
  CtxMap m{};
  uint32_t own = 0;
  bool rest = false;
  for (int v = 0; v < 256; ++v)
    if (h[v] >= kMinOwn) m.ctx_of[v] = (uint8_t)own++;
  for (int v = 0; v < 256; ++v)
    if (h[v] < kMinOwn) {
      m.ctx_of[v] = (uint8_t)own;
      rest |= h[v] != 0;
    }
  m.n = own + (rest ? 1 : 0);
  m.rest = rest;
  if (m.n == 0) m.n = 1;
  return m;
}

// The same contexts in q shared tables: the own contexts ordered by the mean
// of their 7 mantissa bits (the quantity a slope sets), cut into q - 1 runs
// of about equal symbol count; the rare exponents keep the last table.
CtxMap quantised_contexts(const CtxMap& full, const uint8_t* e, const uint8_t* s1, uint32_t n, uint32_t q) {
  if (full.n <= q) return full;
  std::vector<double> sum(full.n, 0.0), cnt(full.n, 0.0);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t c = full.ctx_of[e[i]];
    sum[c] += s1[i] & 0x7F;
    cnt[c] += 1;
  }
  const uint32_t n_own = full.rest ? full.n - 1 : full.n;
  std::vector<uint32_t> order(n_own);
  for (uint32_t c = 0; c < n_own; ++c) order[c] = c;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return sum[a] / cnt[a] < sum[b] / cnt[b]; });
  double total = 0;
  for (uint32_t c = 0; c < n_own; ++c) total += cnt[c];
  const uint32_t groups = full.rest ? q - 1 : q;
  std::vector<uint8_t> group(full.n, (uint8_t)groups);
  double run = 0;
  for (uint32_t c : order) {
    group[c] = (uint8_t)std::min<uint32_t>(groups - 1, (uint32_t)(run * groups / total));
    run += cnt[c];
  }
  CtxMap m{};
  for (int v = 0; v < 256; ++v) m.ctx_of[v] = group[full.ctx_of[v]];
  m.n = q;
  m.rest = full.rest;
  return m;
}

// A block coded with its contexts: tables and payload.
struct CodedBlock {
  std::vector<uint32_t> dec;  // n tables of kProbScale entries
  std::vector<uint32_t> lut;  // exponent -> table offset (ctx * kProbScale)
  std::vector<uint8_t> ctx;   // context of each symbol
  std::vector<uint32_t> freq; // n x 256
  std::vector<uint8_t> payload;
  uint32_t n_ctx = 1;
};

// The decode tables of a block from its frequencies (rans_build_dec per table).
inline void build_dec_tables(CodedBlock& k) {
  for (uint32_t c = 0; c < k.n_ctx; ++c)
    rans_build_dec(k.freq.data() + 256 * (size_t)c, k.dec.data() + (size_t)kProbScale * c);
}

// Encoder: the order of rans_encode_ctx (steps backwards, lanes backwards),
// symbol i with table ctx[i]. Same payload layout.
size_t encode_ctx_symbols(const uint8_t* sym, const uint8_t* ctx, uint32_t n, const RansEncSym* enc,
                          uint16_t* words, uint8_t* out) {
  uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = kRansL;
  uint16_t* const wend = words + n;
  uint16_t* wp = wend;
  const uint32_t n_steps = (n + kLanes - 1) / kLanes;
  for (uint32_t s = n_steps; s-- > 0;) {
    const uint32_t base = s * kLanes;
    const uint32_t here = std::min<uint32_t>(n - base, kLanes);
    for (uint32_t l = here; l-- > 0;) x[l] = rans_enc_put_nb(x[l], enc[256 * ctx[base + l] + sym[base + l]], wp);
  }
  const size_t n_words = (size_t)(wend - wp);
  for (int l = 0; l < kLanes; ++l) store_le32(out + 4 * l, x[l]);
  std::memcpy(out + kRansStateBytes, wp, 2 * n_words);
  return kRansStateBytes + 2 * n_words;
}

CodedBlock code_block(const uint8_t* e, const uint8_t* s1, uint32_t n, const CtxMap& m) {
  CodedBlock b;
  b.n_ctx = m.n;
  b.ctx.resize(n);
  for (uint32_t i = 0; i < n; ++i) b.ctx[i] = m.ctx_of[e[i]];
  b.lut.resize(256);
  for (int v = 0; v < 256; ++v) b.lut[v] = (uint32_t)m.ctx_of[v] * kProbScale;
  std::vector<uint64_t> counts((size_t)m.n * 256, 0);
  for (uint32_t i = 0; i < n; ++i) ++counts[256 * (size_t)b.ctx[i] + s1[i]];
  b.freq.assign((size_t)m.n * 256, 0);
  b.dec.assign((size_t)m.n * kProbScale, 0);
  std::vector<RansEncSym> enc((size_t)m.n * 256);
  for (uint32_t c = 0; c < m.n; ++c) {
    uint32_t* f = b.freq.data() + 256 * (size_t)c;
    if (!rans_normalize(counts.data() + 256 * (size_t)c, f)) f[0] = kProbScale;  // unused table: any valid one
    rans_build_enc(f, enc.data() + 256 * (size_t)c);
  }
  build_dec_tables(b);
  std::vector<uint16_t> words(n);
  b.payload.resize(kRansStateBytes + 2 * (size_t)n);
  b.payload.resize(encode_ctx_symbols(s1, b.ctx.data(), n, enc.data(), words.data(), b.payload.data()));
  return b;
}

// ----------------------------------------------------------- variants --

constexpr int kVariants = 5;  // o0, ctx, lut, q8, q4 (main)

struct Variant {
  const char* name;
  std::vector<CodedBlock> blocks;
  Mode mode;
  std::vector<double> times, built_times, hot_times;  // per pass (Pass)
};

// pass: kPassDecode decodes every block with tables built earlier;
// kPassBuild builds each block's tables right before decoding it;
// kPassHot decodes each block twice and adds the CPU time of the second
// decode (tables as hot as their size allows) to *hot_s.
enum Pass { kPassDecode = 0, kPassBuild = 1, kPassHot = 2 };

// Every block of a variant once, with decoder decode_fn (of mode M): the
// body of the timed loops below.
template <int M>
__attribute__((always_inline)) inline int decode_blocks(DecodeFn decode_fn, std::vector<CodedBlock>& bs,
                                                        const std::vector<uint8_t>& e, uint8_t* out, int pass,
                                                        double* hot_s) {
  int bad = 0;
  for (size_t b = 0; b < bs.size(); ++b) {
    CodedBlock& k = bs[b];
    if (pass == kPassBuild) build_dec_tables(k);
    const uint8_t* cb = M == kExpLut ? e.data() + b * kBlock : k.ctx.data();
    const auto decode = [&] {
      return decode_fn(k.payload.data(), k.payload.size(), kBlock, k.dec.data(), cb, k.lut.data(), out + b * kBlock);
    };
    if (pass == kPassHot) {
      bad |= decode();
      const double t1 = cpu_seconds();
      bad |= decode();
      *hot_s += cpu_seconds() - t1;
    } else {
      bad |= decode();
    }
  }
  return bad;
}

// The timed (and callgrind-visible) loops, one per path and mode: noinline
// and named so that callgrind_annotate lists them.
using BlockLoop = int (*)(std::vector<CodedBlock>&, const std::vector<uint8_t>&, uint8_t*, int, double*);
#define CTXBENCH_LOOP(NAME, DECODER, M)                                                                      \
  __attribute__((noinline)) int NAME(std::vector<CodedBlock>& bs, const std::vector<uint8_t>& e, uint8_t* out, \
                                     int pass, double* hot_s) {                                              \
    return decode_blocks<M>(DECODER<M>, bs, e, out, pass, hot_s);                                            \
  }
CTXBENCH_LOOP(ctxbench_decode_portable_one, decode_portable, kOne)
CTXBENCH_LOOP(ctxbench_decode_portable_ctx, decode_portable, kCtxBytes)
CTXBENCH_LOOP(ctxbench_decode_portable_lut, decode_portable, kExpLut)
#if defined(__x86_64__)
CTXBENCH_LOOP(ctxbench_decode_avx2_one, decode_avx2, kOne)
CTXBENCH_LOOP(ctxbench_decode_avx2_ctx, decode_avx2, kCtxBytes)
CTXBENCH_LOOP(ctxbench_decode_avx2_lut, decode_avx2, kExpLut)
#endif
#undef CTXBENCH_LOOP

// The context bytes from the decoded exponents (what the ctx variants need
// first): one LUT load per symbol.
__attribute__((noinline)) void ctxbench_map_contexts(const std::vector<CodedBlock>& bs, const std::vector<uint8_t>& e,
                                                     uint8_t* out) {
  for (size_t b = 0; b < bs.size(); ++b) {
    uint8_t m[256];
    for (int v = 0; v < 256; ++v) m[v] = (uint8_t)(bs[b].lut[v] >> kProbBits);
    const uint8_t* eb = e.data() + b * kBlock;
    uint8_t* o = out + b * kBlock;
    for (uint32_t i = 0; i < kBlock; ++i) o[i] = m[eb[i]];
  }
}

__attribute__((noinline)) void ctxbench_build_tables(std::vector<CodedBlock>& bs) {
  for (CodedBlock& k : bs) build_dec_tables(k);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct DecodePath {
  const char* name;
  bool ok;  // this CPU runs it
  BlockLoop one, ctx, lut;
};

struct Options {
  double ghz = 2.596;
  int rounds = 9;
  size_t max_blocks = 0;
  bool decode_only = false;  // skip the build+decode and hot passes (callgrind: one call per variant)
  std::string fixtures = TZ_BENCH_FIXTURES_DIR, only_path, only_kind;
};

struct Kind {
  const char *name, *file, *prefix, *dtype;
};

// The five variants of every block of a kind, and its context counts.
void code_variants(const Kind& kd, const std::vector<uint8_t>& e, const std::vector<uint8_t>& s1, size_t nb,
                   Variant* vs) {
  uint64_t ctx_sum = 0, ctx_min = 256, ctx_max = 0;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* eb = e.data() + b * kBlock;
    const uint8_t* sb = s1.data() + b * kBlock;
    CtxMap one{};
    one.n = 1;
    const CtxMap full = exponent_contexts(eb, kBlock);
    ctx_sum += full.n;
    ctx_min = std::min<uint64_t>(ctx_min, full.n);
    ctx_max = std::max<uint64_t>(ctx_max, full.n);
    vs[0].blocks.push_back(code_block(eb, sb, kBlock, one));
    vs[1].blocks.push_back(code_block(eb, sb, kBlock, full));
    vs[2].blocks.push_back(vs[1].blocks.back());  // the same tables at their own addresses
    vs[3].blocks.push_back(code_block(eb, sb, kBlock, quantised_contexts(full, eb, sb, kBlock, 8)));
    vs[4].blocks.push_back(code_block(eb, sb, kBlock, quantised_contexts(full, eb, sb, kBlock, 4)));
  }
  // Exponents of all the blocks together: the contexts one table set for
  // the whole kind would need.
  const CtxMap whole = exponent_contexts(e.data(), (uint32_t)std::min<size_t>(e.size(), UINT32_MAX));
  std::printf("\n%s: %zu blocks (tensors of >= 64 Ki elements), contexts per block %.1f (min %llu, max %llu), over "
              "all its blocks %u\n", kd.name, nb, (double)ctx_sum / (double)nb, (unsigned long long)ctx_min,
              (unsigned long long)ctx_max, whole.n);
  std::printf("  stream-1 payload bytes (lane states + words, tables not counted): ");
  for (int i = 0; i < kVariants; ++i) {
    size_t bytes = 0, tables = 0;
    for (const CodedBlock& k : vs[i].blocks) {
      bytes += k.payload.size();
      tables += k.n_ctx;
    }
    std::printf("%s %zu (%.4f bits/sym, %zu tables)  ", vs[i].name, bytes,
                8.0 * (double)bytes / (double)(nb * kBlock), tables);
  }
  std::printf("\n");
}

// Interleaved rounds of every variant on one path; every output checked.
// Returns false (after saying why) when a decoded stream differs.
bool time_path(const Kind& kd, const DecodePath& pa, const Options& o, const std::vector<uint8_t>& e,
               const std::vector<uint8_t>& s1, Variant* vs) {
  const size_t nb = e.size() / kBlock;
  std::vector<uint8_t> out(nb * kBlock), cmap(nb * kBlock);
  const double per_sym = o.ghz * 1e9 / (double)(nb * kBlock);
  for (int i = 0; i < kVariants; ++i) vs[i].times.clear(), vs[i].built_times.clear(), vs[i].hot_times.clear();
  std::vector<double> map_t, build_one, build_full;
  for (int r = 0; r < o.rounds; ++r) {
    for (int pass = kPassDecode; pass <= (o.decode_only ? kPassDecode : kPassHot); ++pass)
      for (int i = 0; i < kVariants; ++i) {
        Variant& v = vs[i];
        const BlockLoop loop = v.mode == kOne ? pa.one : v.mode == kExpLut ? pa.lut : pa.ctx;
        std::memset(out.data(), 0, out.size());
        double hot = 0;
        const double t0 = cpu_seconds();
        const int bad = loop(v.blocks, e, out.data(), pass, &hot);
        const double t = cpu_seconds() - t0;
        if (pass == kPassDecode) v.times.push_back(t);
        else if (pass == kPassBuild) v.built_times.push_back(t);
        else v.hot_times.push_back(hot);
        if (bad || std::memcmp(out.data(), s1.data(), out.size()) != 0) {
          std::fprintf(stderr, "%s %s %s: decoded stream 1 differs from the input\n", kd.name, pa.name, v.name);
          return false;
        }
      }
    double t0 = cpu_seconds();
    ctxbench_map_contexts(vs[1].blocks, e, cmap.data());
    map_t.push_back(cpu_seconds() - t0);
    for (size_t b = 0; b < nb; ++b)
      if (std::memcmp(cmap.data() + b * kBlock, vs[1].blocks[b].ctx.data(), kBlock) != 0) {
        std::fprintf(stderr, "%s: context map differs\n", kd.name);
        return false;
      }
    t0 = cpu_seconds();
    ctxbench_build_tables(vs[0].blocks);
    build_one.push_back(cpu_seconds() - t0);
    t0 = cpu_seconds();
    ctxbench_build_tables(vs[1].blocks);
    build_full.push_back(cpu_seconds() - t0);
  }
  // One row per pass: every variant's median, in cycles per symbol.
  const auto row = [&](const char* pass, std::vector<double> Variant::*times) {
    std::printf("  %-9s %s", pa.name, pass);
    for (int i = 0; i < kVariants; ++i) std::printf(" %s %.2f", vs[i].name, median(vs[i].*times) * per_sym);
  };
  row("decode      ", &Variant::times);
  std::printf(" | map %.2f | build o0 %.2f ctx %.2f\n", median(map_t) * per_sym, median(build_one) * per_sym,
              median(build_full) * per_sym);
  if (!o.decode_only) {
    row("build+decode", &Variant::built_times);
    std::printf("\n");
    row("hot         ", &Variant::hot_times);
    std::printf("\n");
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const char* f = std::getenv("TZ_FIXTURES")) o.fixtures = f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ghz" && i + 1 < argc) o.ghz = std::atof(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) o.rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--max-blocks" && i + 1 < argc) o.max_blocks = (size_t)std::atoll(argv[++i]);
    else if (a == "--path" && i + 1 < argc) o.only_path = argv[++i];
    else if (a == "--kind" && i + 1 < argc) o.only_kind = argv[++i];
    else if (a == "--fixtures" && i + 1 < argc) o.fixtures = argv[++i];
    else if (a == "--decode-only") o.decode_only = true;
    else {
      std::fprintf(stderr, "usage: %s [--ghz G] [--rounds R] [--max-blocks B] [--path portable|avx2] "
                           "[--kind bf16|master|adam_m] [--fixtures DIR] [--decode-only]\n", argv[0]);
      return 2;
    }
  }
  const Kind kinds[] = {{"bf16", "gpt-small-step400-model-bf16.safetensors", "", "BF16"},
                        {"master", "gpt-small-step400-optim-fp32.safetensors", "master.", "F32"},
                        {"adam_m", "gpt-small-step400-optim-fp32.safetensors", "exp_avg.", "F32"}};
  std::vector<DecodePath> paths = {
      {"portable", true, ctxbench_decode_portable_one, ctxbench_decode_portable_ctx, ctxbench_decode_portable_lut}};
#if defined(__x86_64__)
  paths.push_back({"avx2", cpu::simd_path_cpu_has(cpu::SimdPath::kAvx2), ctxbench_decode_avx2_one,
                   ctxbench_decode_avx2_ctx, ctxbench_decode_avx2_lut});
#endif
  std::printf("stream-1 decode with exponent-chosen tables: CPU time, median of %d interleaved rounds, cycles per "
              "symbol at %.3f GHz; blocks of %u elements; every decoded stream checked\n", o.rounds, o.ghz, kBlock);
  for (const Kind& kd : kinds) {
    if (!o.only_kind.empty() && o.only_kind != kd.name) continue;
    std::vector<uint8_t> e, s1;
    size_t nb = 0;
    if (!load_fixture_blocks(o.fixtures, kd.file, kd.prefix, kd.dtype, o.max_blocks, e, s1, nb)) return 2;
    Variant vs[kVariants] = {{"o0", {}, kOne, {}, {}, {}}, {"ctx", {}, kCtxBytes, {}, {}, {}},
                     {"lut", {}, kExpLut, {}, {}, {}}, {"q8", {}, kCtxBytes, {}, {}, {}},
                     {"q4", {}, kCtxBytes, {}, {}, {}}};
    code_variants(kd, e, s1, nb, vs);
    for (const DecodePath& pa : paths) {
      if (!o.only_path.empty() && o.only_path != pa.name) continue;
      if (!pa.ok) {
        std::printf("  %-9s skipped: this CPU has no AVX2\n", pa.name);
        continue;
      }
      if (!time_path(kd, pa, o, e, s1, vs)) return 1;
    }
  }
  return 0;
}

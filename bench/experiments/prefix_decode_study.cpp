// A prefix (Huffman) code for the exponent stream, decoded several symbols
// per table lookup with scalar loads only, against today's 32-lane rANS
// decoders, before any format change: size and decode cost on the same
// blocks of real data.
//
// The question: the version-3 rANS step needs one table entry per symbol
// (an 8-lane gather, or eight scalar loads, per 8 symbols), yet an exponent
// carries ~2.6 bits, so most of each lookup's 12 index bits are unused. A
// prefix code limited to L bits can be decoded with one lookup of the next
// L bits, which yields every whole codeword in them (3-4 exponents on
// average): no gather, no multiply, one load per several symbols. What does
// it cost in size, and what does it gain in time?
//
// Per 64 Ki-element block of every kind (BF16 weights; FP32 master, Adam m,
// Adam v: stream 0, the exponent byte):
//   rans    the block coded by the library's rANS coder (32 lanes,
//           kProbScale 4096) with a table of the block's own counts,
//           decoded by each CPU kernel set this machine has (the library's
//           own decoders, codec_kernel_variants)
//   prefix  the length-limited prefix code of src/codec/prefix_code.h for
//           the block's counts (beside the optimal lengths of package-merge,
//           to show what its repair of long codes costs), canonical, the
//           block cut into K segments of equal length, each its own
//           MSB-first bit stream (the codec's encoder); decoded K segments
//           at a time, interleaved, each lookup of L bits writing up to 6
//           symbols (one 8-byte store) and consuming their bits
// Size: payload bytes per symbol (rans: the coder's payload; prefix: the
// segments, byte-padded, plus 4 bytes per segment for its start), and the
// table description each needs (rans: 12-bit frequencies of the present
// symbols; prefix: 4-bit lengths over the range of present symbols),
// beside the order-0 entropy of the block. Time: CPU time per variant
// over all blocks, variants interleaved round by round, median, as cycles
// per symbol at --ghz. Every decoded block is compared with the input.
//
//   build/bench/tz_prefix_decode_study [--ghz G] [--rounds R] [--max-blocks B]
//       [--kind bf16|master|adam_m|adam_v] [--bits L] [--fixtures DIR]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "codec/prefix_code.h"
#include "codec/rans.h"
#include "cpu/kernels.h"
#include "cpu/prefix_decode.h"
#include "cpu/simd_path.h"
#include "fixture_blocks.h"
#include "prefix_decoders.h"

#ifndef TZ_BENCH_FIXTURES_DIR
#define TZ_BENCH_FIXTURES_DIR "../shared/fixtures"
#endif

using namespace tz;
using namespace tz::experiments;

namespace {

constexpr uint32_t kBlock = kFixtureBlock;

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// ------------------------------------------------------ code lengths --

// Optimal code lengths limited to `limit` bits (package-merge) for the
// symbols with a non-zero count; len[s] = 0 for the others. A block of one
// symbol gets length 1.
void limited_lengths(const uint64_t* counts, unsigned limit, uint8_t* len) {
  struct Item {
    uint64_t w;
    int leaf;        // symbol, or -1 for a package
    int a, b;        // a package's two items in the previous level's list
  };
  std::vector<int> syms;
  for (int s = 0; s < 256; ++s) {
    len[s] = 0;
    if (counts[s]) syms.push_back(s);
  }
  if (syms.size() == 1) {
    len[syms[0]] = 1;
    return;
  }
  std::sort(syms.begin(), syms.end(), [&](int x, int y) { return counts[x] < counts[y]; });
  std::vector<std::vector<Item>> levels(limit);
  std::vector<Item> leaves;
  for (int s : syms) leaves.push_back({counts[s], s, -1, -1});
  levels[0] = leaves;  // deepest level: the leaves alone
  for (unsigned l = 1; l < limit; ++l) {
    const std::vector<Item>& prev = levels[l - 1];
    std::vector<Item> pk;
    for (size_t i = 0; i + 1 < prev.size(); i += 2) pk.push_back({prev[i].w + prev[i + 1].w, -1, (int)i, (int)i + 1});
    std::vector<Item>& cur = levels[l];
    std::merge(leaves.begin(), leaves.end(), pk.begin(), pk.end(), std::back_inserter(cur),
               [](const Item& x, const Item& y) { return x.w < y.w; });
  }
  // The first 2n - 2 items of the top level; every leaf under them adds one
  // to its symbol's length.
  std::function<void(unsigned, int)> count = [&](unsigned l, int i) {
    const Item& it = levels[l][i];
    if (it.leaf >= 0) {
      ++len[it.leaf];
      return;
    }
    count(l - 1, it.a);
    count(l - 1, it.b);
  };
  for (size_t i = 0; i < 2 * syms.size() - 2; ++i) count(limit - 1, (int)i);
}

// ------------------------------------------------------------ coder --

// ------------------------------------------------------------ study --

struct Options {
  double ghz = 2.596;
  int rounds = 9;
  size_t max_blocks = 64;
  std::string only_kind, fixtures = TZ_BENCH_FIXTURES_DIR;
  unsigned bits = 11;
};

struct Variant {
  std::string name;
  std::function<int(size_t b, uint8_t* out)> run;  // decodes block b, returns non-zero on error
  std::vector<double> t;
};

double h0_bits(const uint64_t* c, uint64_t n) {
  double h = 0;
  for (int s = 0; s < 256; ++s)
    if (c[s]) h -= (double)c[s] * std::log2((double)c[s] / (double)n);
  return h;
}

// BF16 elements, whole (kind bf16 only): the rANS merged decoders (stream 0
// decoded and merged with the raw sign|mantissa bytes in one pass) against
// the prefix decoder into a 64 KiB buffer followed by the kernel set's
// merge pass. Cycles per element.
template <unsigned L>
int study_bf16_elements(const std::vector<uint8_t>& e, const std::vector<uint8_t>& s1, size_t nb, const Options& o,
                        const std::function<const uint8_t*(size_t)>& rans_payload,
                        const std::function<size_t(size_t)>& rans_size,
                        const std::function<const uint32_t*(size_t)>& rans_dec,
                        const std::function<const PrefixBlock&(size_t)>& prefix4) {
  std::vector<Variant> vs;
  std::vector<uint8_t> tmp(kBlock + 64);
  std::vector<const uint8_t*> raw(nb);
  for (size_t b = 0; b < nb; ++b) raw[b] = s1.data() + b * kBlock;
  for (cpu::SimdPath p : cpu::kAllSimdPaths) {
    if (!cpu::codec_kernels_for(p) || !cpu::simd_path_cpu_has(p)) continue;
    for (const cpu::CodecKernels* k : cpu::codec_kernel_variants(p)) {
      vs.push_back({std::string("rans merged ") + cpu::codec_kernels_name(*k), [=, &raw](size_t b, uint8_t* out) {
                      return k->rans_decode_merged(kBF16, rans_payload(b), rans_size(b), kBlock, rans_dec(b),
                                                   RansCtx{}, &raw[b], out);
                    }, {}});
    }
  }
  for (cpu::SimdPath p : {cpu::SimdPath::kPortable, cpu::SimdPath::kAvx2}) {
    const cpu::CodecKernels* k = cpu::codec_kernels_for(p);
    if (!k || !cpu::simd_path_cpu_has(p)) continue;
    vs.push_back({std::string("prefix K=4 (registers) + merge of ") + cpu::simd_path_name(p),
                  [=, &tmp, &raw](size_t b, uint8_t* out) {
                    decode_prefix4_regs<L>(prefix4(b), 4, kBlock, tmp.data());
                    const uint8_t* st[2] = {tmp.data(), raw[b]};
                    k->merge(kBF16, st, kBlock, out);
                    return 0;
                  }, {}});
  }
  std::vector<uint8_t> want(2 * nb * kBlock), out(2 * nb * kBlock + 64);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* st[2] = {e.data() + b * kBlock, raw[b]};
    cpu::codec_kernels_for(cpu::SimdPath::kPortable)->merge(kBF16, st, kBlock, want.data() + 2 * b * kBlock);
  }
  for (int r = 0; r < o.rounds; ++r) {
    for (size_t i = 0; i < vs.size(); ++i) {
      Variant& v = vs[(i + (size_t)r) % vs.size()];
      int bad = 0;
      const double t0 = cpu_seconds();
      for (size_t b = 0; b < nb; ++b) bad |= v.run(b, out.data() + 2 * b * kBlock);
      v.t.push_back(cpu_seconds() - t0);
      if (bad || std::memcmp(out.data(), want.data(), want.size()) != 0) {
        std::fprintf(stderr, "bf16 elements: %s decoded the blocks wrongly\n", v.name.c_str());
        return 1;
      }
    }
  }
  std::printf("  BF16 elements (exponent decoded and merged with the raw sign|mantissa bytes), cycles per element:\n");
  for (Variant& v : vs) {
    std::sort(v.t.begin(), v.t.end());
    std::printf("    %-72s %6.3f\n", v.name.c_str(), v.t[v.t.size() / 2] * o.ghz * 1e9 / ((double)nb * kBlock));
  }
  return 0;
}

template <unsigned L>
int study_kind(const char* name, const std::vector<uint8_t>& e, const std::vector<uint8_t>& s1, size_t nb,
               const Options& o) {
  struct BlockCodes {
    std::vector<uint8_t> rans;
    std::vector<uint32_t> dec;
    PrefixBlock pre[3];  // K = 4, 8, 32
    std::vector<uint64_t> short4, short32;  // short_chain_table of pre[0], pre[2]
    std::vector<uint8_t> contig;            // 32 segments end to end (prefix_encode), 16 bytes of slack
    uint64_t run_bit[5];                    // ... as 4 runs of 8 segments
    uint32_t run_count[4];
  };
  const unsigned Ks[3] = {4, 8, 32};
  std::vector<BlockCodes> bc(nb);
  double h0 = 0, optimal_bits = 0, rans_bytes = 0, rans_tab = 0, pre_bytes[3] = {0, 0, 0}, pre_tab = 0, mean_len = 0, contig = 0;
  std::vector<uint16_t> words(kBlock);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* sym = e.data() + b * kBlock;
    uint64_t counts[256] = {0};
    for (uint32_t i = 0; i < kBlock; ++i) ++counts[sym[i]];
    h0 += h0_bits(counts, kBlock) / 8;
    uint32_t freq[256];
    std::vector<RansEncSym> enc(256);
    rans_normalize(counts, freq);
    rans_build_enc(freq, enc.data());
    bc[b].dec.resize(kProbScale);
    rans_build_dec(freq, bc[b].dec.data());
    bc[b].rans.resize(kRansStateBytes + 2 * (size_t)kBlock + 64);
    bc[b].rans.resize(rans_encode(sym, kBlock, enc.data(), words.data(), bc[b].rans.data(), SIZE_MAX));
    rans_bytes += (double)bc[b].rans.size();
    uint8_t len[256], pm[256];
    uint16_t code[256] = {0};
    prefix_code_lengths(counts, L, len);  // the codec's lengths
    prefix_canonical_codes(len, code);
    limited_lengths(counts, L, pm);  // the optimum, for comparison
    for (int s = 0; s < 256; ++s) optimal_bits += (double)counts[s] * pm[s];
    int lo = 255, hi = 0, present = 0;
    double bits = 0;
    for (int s = 0; s < 256; ++s)
      if (counts[s]) {
        lo = std::min(lo, s), hi = std::max(hi, s), ++present;
        bits += (double)counts[s] * len[s];
      }
    mean_len += bits / kBlock;
    contig += std::ceil(bits / 8) + 2.0 * 32;
    rans_tab += 2 + (present * 12 + 7) / 8 + 32;  // range + 12-bit freqs + a 256-bit presence map
    pre_tab += 2 + ((hi - lo + 1) * 4 + 7) / 8;
    for (int k = 0; k < 3; ++k) {
      build_tables(len, code, L, bc[b].pre[k]);
      encode_prefix(sym, kBlock, Ks[k], len, code, bc[b].pre[k]);
      pre_bytes[k] += (double)bc[b].pre[k].payload + 4.0 * Ks[k];
    }
    bc[b].short4 = short_chain_table(bc[b].pre[0], L);
    bc[b].short32 = short_chain_table(bc[b].pre[2], L);
    {
      uint64_t ends[32];
      bc[b].contig.resize(2 * (size_t)kBlock + 16);
      bc[b].contig.resize(prefix_encode(sym, kBlock, len, code, 32, ends, bc[b].contig.data(), bc[b].contig.size()));
      bc[b].run_bit[0] = 0;
      for (int r = 0; r < 4; ++r) {
        bc[b].run_bit[r + 1] = ends[8 * r + 7];
        bc[b].run_count[r] = kBlock / 4;
      }
    }
  }
  const double n = (double)nb * kBlock;
  std::printf("\n%s: %zu blocks of %u exponents; order-0 entropy %.4f bits/symbol; prefix code (L = %u) mean "
              "length %.4f bits/symbol\n", name, nb, kBlock, 8 * h0 / n, L, mean_len / nb);
  std::printf("  size, bytes per symbol (vs entropy): rans %.5f (%+.2f%%) + table %.5f | prefix K=4 %.5f (%+.2f%%), "
              "K=8 %.5f (%+.2f%%), K=32 %.5f (%+.2f%%) + table %.5f\n",
              rans_bytes / n, 100 * (rans_bytes / h0 - 1), rans_tab / n, pre_bytes[0] / n, 100 * (pre_bytes[0] / h0 - 1),
              pre_bytes[1] / n, 100 * (pre_bytes[1] / h0 - 1), pre_bytes[2] / n, 100 * (pre_bytes[2] / h0 - 1),
              pre_tab / n);
  std::printf("  the codec's lengths (prefix_code_lengths) against the optimal ones of at most L bits "
              "(package-merge): %+.3f%%\n", 100 * (mean_len * kBlock / optimal_bits - 1));
  std::printf("  size of 32 segments laid end to end at bit granularity, 16-bit bit lengths (a GPU thread each; a CPU "
              "decodes runs of 8 as one stream, as K=4): %.5f (%+.2f%%)\n", contig / n, 100 * (contig / h0 - 1));
  std::vector<Variant> vs;
  for (cpu::SimdPath p : cpu::kAllSimdPaths) {
    if (!cpu::codec_kernels_for(p) || !cpu::simd_path_cpu_has(p)) continue;
    for (const cpu::CodecKernels* k : cpu::codec_kernel_variants(p)) {
      std::string label = std::string("rans ") + cpu::codec_kernels_name(*k);
      vs.push_back({label, [&bc, k](size_t b, uint8_t* out) {
                      return k->rans_decode(bc[b].rans.data(), bc[b].rans.size(), kBlock, bc[b].dec.data(), RansCtx{},
                                            out);
                    }, {}});
    }
  }
  bool prefix_ok = true;
#if defined(__x86_64__)
  prefix_ok = cpu::simd_path_cpu_has(cpu::SimdPath::kAvx2);  // the prefix decoders use BMI2, as AVX2 CPUs have
  if (!prefix_ok) std::printf("  prefix decoders skipped: this CPU has no AVX2/BMI2\n");
#endif
  auto add_prefix = [&](const char* label, std::function<void(size_t, uint8_t*)> fn) {
    if (prefix_ok) vs.push_back({label, [fn](size_t b, uint8_t* out) { fn(b, out); return 0; }, {}});
  };
  add_prefix("prefix K=4, 4 interleaved", [&bc](size_t b, uint8_t* out) { decode_prefix<L, 4>(bc[b].pre[0], 4, kBlock, out); });
  add_prefix("prefix K=4, 4 interleaved, states in registers",
             [&bc](size_t b, uint8_t* out) { decode_prefix4_regs<L>(bc[b].pre[0], 4, kBlock, out); });
  add_prefix("prefix K=32, 4 interleaved, states in registers",
             [&bc](size_t b, uint8_t* out) { decode_prefix4_regs<L>(bc[b].pre[2], 32, kBlock, out); });
  add_prefix("prefix K=32 byte-aligned, 4 lanes rotating through them, registers",
             [&bc](size_t b, uint8_t* out) { decode_prefix32_rotating<L>(bc[b].pre[2], kBlock, out); });
  add_prefix("library: tz::cpu::prefix_decode_runs, 32 segments end to end as 4 runs",
             [&bc](size_t b, uint8_t* out) {
               const int st = cpu::prefix_decode_runs(bc[b].contig.data(), bc[b].contig.size(), bc[b].run_bit,
                                                      bc[b].run_count, 4,
                                                      cpu::PrefixTables{bc[b].pre[2].single.data(),
                                                                        bc[b].pre[2].multi.data()}, out);
               if (st) std::abort();  // checked again by the comparison of every decoded block
             });
  add_prefix("prefix K=4, 4 interleaved, short chain (<= 4 symbols a lookup)", [&bc](size_t b, uint8_t* out) {
    decode_prefix4_short<L>(bc[b].pre[0], bc[b].short4.data(), 4, kBlock, out);
  });
  add_prefix("prefix K=32, 4 interleaved, short chain (<= 4 symbols a lookup)", [&bc](size_t b, uint8_t* out) {
    decode_prefix4_short<L>(bc[b].pre[2], bc[b].short32.data(), 32, kBlock, out);
  });
  add_prefix("prefix K=8, 8 interleaved", [&bc](size_t b, uint8_t* out) { decode_prefix<L, 8>(bc[b].pre[1], 8, kBlock, out); });
  add_prefix("prefix K=32, 4 interleaved",
             [&bc](size_t b, uint8_t* out) { decode_prefix<L, 4>(bc[b].pre[2], 32, kBlock, out); });
  add_prefix("prefix K=32, 8 interleaved",
             [&bc](size_t b, uint8_t* out) { decode_prefix<L, 8>(bc[b].pre[2], 32, kBlock, out); });
  std::vector<uint8_t> out(e.size() + 64);
  for (int r = 0; r < o.rounds; ++r) {
    for (size_t i = 0; i < vs.size(); ++i) {
      Variant& v = vs[(i + (size_t)r) % vs.size()];
      std::memset(out.data(), 0xA5, out.size());
      int bad = 0;
      const double t0 = cpu_seconds();
      for (size_t b = 0; b < nb; ++b) bad |= v.run(b, out.data() + b * kBlock);
      v.t.push_back(cpu_seconds() - t0);
      if (bad || std::memcmp(out.data(), e.data(), nb * kBlock) != 0) {
        std::fprintf(stderr, "%s: %s decoded the blocks wrongly\n", name, v.name.c_str());
        return 1;
      }
    }
  }
  std::printf("  decode, cycles per symbol at %.3f GHz (median of %d interleaved rounds):\n", o.ghz, o.rounds);
  for (Variant& v : vs) {
    std::sort(v.t.begin(), v.t.end());
    std::printf("    %-72s %6.3f\n", v.name.c_str(), v.t[v.t.size() / 2] * o.ghz * 1e9 / n);
  }
  if (std::strcmp(name, "bf16") != 0 || !prefix_ok) return 0;
  return study_bf16_elements<L>(
      e, s1, nb, o, [&bc](size_t b) { return (const uint8_t*)bc[b].rans.data(); },
      [&bc](size_t b) { return bc[b].rans.size(); }, [&bc](size_t b) { return (const uint32_t*)bc[b].dec.data(); },
      [&bc](size_t b) -> const PrefixBlock& { return bc[b].pre[0]; });
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
    else if (a == "--kind" && i + 1 < argc) o.only_kind = argv[++i];
    else if (a == "--bits" && i + 1 < argc) o.bits = (unsigned)std::atoi(argv[++i]);
    else if (a == "--fixtures" && i + 1 < argc) o.fixtures = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--ghz G] [--rounds R] [--max-blocks B] [--kind bf16|master|adam_m|adam_v] "
                           "[--bits 10|11|12] [--fixtures DIR]\n", argv[0]);
      return 2;
    }
  }
  if (o.bits < 10 || o.bits > 12) {
    std::fprintf(stderr, "--bits must be 10, 11 or 12\n");
    return 2;
  }
  struct Kind {
    const char *name, *file, *prefix, *dtype;
  };
  const Kind kinds[] = {{"bf16", "gpt-small-step400-model-bf16.safetensors", "", "BF16"},
                        {"master", "gpt-small-step400-optim-fp32.safetensors", "master.", "F32"},
                        {"adam_m", "gpt-small-step400-optim-fp32.safetensors", "exp_avg.", "F32"},
                        {"adam_v", "gpt-small-step400-optim-fp32.safetensors", "exp_avg_sq.", "F32"}};
  std::printf("exponent stream: 32-lane rANS against a length-limited prefix code decoded several symbols per "
              "lookup; CPU time, cycles per symbol at %.3f GHz\n", o.ghz);
  for (const Kind& kd : kinds) {
    if (!o.only_kind.empty() && o.only_kind != kd.name) continue;
    std::vector<uint8_t> e, s1;
    size_t nb = 0;
    if (!load_fixture_blocks(o.fixtures, kd.file, kd.prefix, kd.dtype, o.max_blocks, e, s1, nb)) return 2;
    const int rc = o.bits == 10 ? study_kind<10>(kd.name, e, s1, nb, o)
                   : o.bits == 11 ? study_kind<11>(kd.name, e, s1, nb, o)
                                  : study_kind<12>(kd.name, e, s1, nb, o);
    if (rc) return rc;
  }
  return 0;
}

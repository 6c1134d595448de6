// Cost per symbol of each CPU kernel set's entries (src/cpu/kernels.h) on
// real data: the exponent stream of 64 consecutive blocks of 64 Ki BF16
// weights of the fixture checkpoint, one table from their histogram (as
// level 1 builds it for a tensor), every block distinct (one block decoded
// over and over lets the branch predictor learn it, which flatters branchy
// code). Best process CPU time of 9 repetitions, converted to cycles at the
// clock given (--ghz, default 2.596: the TSC rate of the development VM), per
// symbol. Every path this build and CPU have; TZ_SIMD is not needed.
// enc_wide encodes the blocks' sign|mantissa bytes with their own table:
// 256 live symbols, so the SIMD encoders take the gather path (as FP8 and
// FP16 top bytes do) where `encode` takes the 16-symbol window; dec_wide
// decodes them (near 8 bits a symbol: about half the lanes of a step take a
// word, where the exponents' 2.6 bits take one in six).
//
//   build/bench/tz_kernel_bench [--ghz 2.596] [file.safetensors]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "codec/fields.h"
#include "codec/rans.h"
#include "cpu/kernels.h"
#include "cpu/simd_path.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifndef TZ_BENCH_FIXTURES_DIR
#define TZ_BENCH_FIXTURES_DIR "../shared/fixtures"
#endif

using namespace tz;
using namespace tz::cpu;

namespace {

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#if defined(__x86_64__)
// Cycles of one 8-lane AVX2 gather (vpgatherdd) from a 16 KiB table, eight
// independent chains in flight (so throughput, not latency): the floor under
// the AVX2 rANS kernels, which gather once per 8 symbols (the decoder its
// table entry, the encoder its freq | start).
__attribute__((target("avx2"))) double gather_cycles(const uint32_t* table, double ghz) {
  constexpr long kIters = 2000000;
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    __m256i v[8];
    for (int c = 0; c < 8; ++c) v[c] = _mm256_setr_epi32(c, 9 * c + 1, 3, 77 * c, 5, 1000, 4095 - c, 2048);
    const __m256i mask = _mm256_set1_epi32(kProbScale - 1);
    const double t0 = cpu_seconds();
    for (long i = 0; i < kIters; ++i)
      for (int c = 0; c < 8; ++c)
        v[c] = _mm256_add_epi32(v[c], _mm256_srli_epi32(
                                          _mm256_i32gather_epi32((const int*)table, _mm256_and_si256(v[c], mask), 4), 20));
    best = std::min(best, cpu_seconds() - t0);
    __m256i all = v[0];
    for (int c = 1; c < 8; ++c) all = _mm256_xor_si256(all, v[c]);
    uint32_t sink[8];
    _mm256_storeu_si256((__m256i*)sink, all);
    if (sink[0] == 0x12345678u) std::printf(" ");  // keeps the chains alive
  }
  return best * ghz * 1e9 / (8.0 * kIters);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  double ghz = 2.596;
  std::string file = std::string(TZ_BENCH_FIXTURES_DIR) + "/gpt-small-step400-model-bf16.safetensors";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ghz") && i + 1 < argc) ghz = std::atof(argv[++i]);
    else file = argv[i];
  }
  constexpr uint32_t n = 65536;
  constexpr int B = 64;
  FILE* fp = std::fopen(file.c_str(), "rb");
  uint64_t hl = 0;
  std::vector<uint16_t> v((size_t)n * B);
  // The data section from its start: all BF16 in the fixture's model file.
  if (!fp || std::fread(&hl, 8, 1, fp) != 1 || std::fseek(fp, (long)(8 + hl), SEEK_SET) != 0 ||
      std::fread(v.data(), 2, v.size(), fp) != v.size()) {
    std::fprintf(stderr, "cannot read %zu BF16 values from %s\n", v.size(), file.c_str());
    return 2;
  }
  std::fclose(fp);
  std::vector<uint8_t> sym(v.size()), mant(v.size());
  for (size_t i = 0; i < v.size(); ++i) split_elem_bf16(v[i], sym[i], mant[i]);
  std::vector<uint64_t> counts(256, 0);
  for (uint8_t s : sym) ++counts[s];
  std::vector<uint32_t> freq(256), fst(256), dec(kProbScale), dec_copy(kProbScale);
  std::vector<RansEncSym> enc(256);
  rans_normalize(counts.data(), freq.data());
  rans_build_enc(freq.data(), enc.data());
  build_freq_start(freq.data(), fst.data());
  rans_build_dec(freq.data(), dec.data());
  dec_copy = dec;  // a second table at another address (each block its own table)
  // The sign|mantissa bytes with a table of their own: a wide alphabet (all
  // 256 values), so the SIMD encoders gather their entries (column
  // enc_wide; FP8 and FP16 top bytes code so).
  std::vector<uint64_t> mcounts(256, 0);
  for (uint8_t m : mant) ++mcounts[m];
  std::vector<uint32_t> mfreq(256), mfst(256), mdec(kProbScale);
  std::vector<RansEncSym> menc(256);
  rans_normalize(mcounts.data(), mfreq.data());
  rans_build_enc(mfreq.data(), menc.data());
  build_freq_start(mfreq.data(), mfst.data());
  rans_build_dec(mfreq.data(), mdec.data());
  std::vector<std::vector<uint8_t>> payload(B), mpayload(B);
  std::vector<uint16_t> words(n);
  for (int b = 0; b < B; ++b) {
    payload[b].resize(kRansStateBytes + 2 * (size_t)n);
    payload[b].resize(rans_encode(sym.data() + (size_t)b * n, n, enc.data(), words.data(), payload[b].data(),
                                  SIZE_MAX));
    mpayload[b].resize(kRansStateBytes + 2 * (size_t)n);
    mpayload[b].resize(rans_encode(mant.data() + (size_t)b * n, n, menc.data(), words.data(), mpayload[b].data(),
                                   SIZE_MAX));
  }
  std::vector<uint8_t> out(2 * (size_t)n * B), tmp(kRansStateBytes + 2 * (size_t)n);
  std::printf("kernel cost, cycles per symbol at %.3f GHz (CPU time, best of 9), %d distinct blocks of %u BF16 "
              "exponents of %s\n", ghz, B, n, file.c_str());
  std::printf("%-9s %7s %8s %7s %8s %7s %8s %9s %9s %7s %7s %7s\n", "path", "encode", "enc_wide", "decode", "dec_wide",
              "decode2", "dec_bf16",
              "dec2_bf16", "dec2_2tab", "hist", "split", "minmax");
  for (SimdPath p : kAllSimdPaths) {
    if (!codec_kernels_for(p) || !simd_path_cpu_has(p)) {
      std::printf("%-9s (not on this CPU or build)\n", simd_path_name(p));
      continue;
    }
    for (const CodecKernels* k : codec_kernel_variants(p)) {
    auto cost = [&](auto fn) {
      double best = 1e30;
      for (int r = 0; r < 9; ++r) {
        const double t0 = cpu_seconds();
        fn();
        best = std::min(best, cpu_seconds() - t0);
      }
      return best * ghz * 1e9 / ((double)n * B);
    };
    int sa = 0, sb = 0, bad = 0;
    const double e = cost([&] {
      for (int b = 0; b < B; ++b)
        k->rans_encode(sym.data() + (size_t)b * n, n, EncTables{enc.data(), fst.data()}, RansCtx{}, words.data(),
                       tmp.data(), SIZE_MAX);
    });
    const double ew = cost([&] {
      for (int b = 0; b < B; ++b)
        k->rans_encode(mant.data() + (size_t)b * n, n, EncTables{menc.data(), mfst.data()}, RansCtx{}, words.data(),
                       tmp.data(), SIZE_MAX);
    });
    const double d = cost([&] {
      for (int b = 0; b < B; ++b)
        bad |= k->rans_decode(payload[b].data(), payload[b].size(), n, dec.data(), RansCtx{}, out.data() + (size_t)b * n);
    });
    const double dw = cost([&] {
      for (int b = 0; b < B; ++b)
        bad |= k->rans_decode(mpayload[b].data(), mpayload[b].size(), n, mdec.data(), RansCtx{},
                              out.data() + (size_t)b * n);
    });
    if (bad || std::memcmp(out.data(), mant.data(), (size_t)n * B) != 0) {
      std::fprintf(stderr, "%s: decoded sign|mantissa bytes differ\n", simd_path_name(p));
      return 1;
    }
    auto stream = [&](int b, uint8_t* o, const uint32_t* d = nullptr) {
      return RansStream{payload[b].data(), payload[b].size(), n, d ? d : dec.data(), o};
    };
    const double d2 = cost([&] {
      for (int b = 0; b < B; b += 2)
        k->rans_decode2(stream(b, out.data() + (size_t)b * n), &sa, stream(b + 1, out.data() + (size_t)(b + 1) * n), &sb);
      bad |= sa | sb;
    });
    // The merged decoders take the raw streams as an array (BF16: one).
    std::vector<const uint8_t*> mant_ptr(B);
    for (int b = 0; b < B; ++b) mant_ptr[b] = mant.data() + (size_t)b * n;
    auto mant_of = [&](int b) { return &mant_ptr[b]; };
    const double db = cost([&] {
      for (int b = 0; b < B; ++b)
        bad |= k->rans_decode_merged(kBF16, payload[b].data(), payload[b].size(), n, dec.data(), RansCtx{},
                                     mant_of(b), out.data() + 2 * (size_t)b * n);
    });
    const double d2b = cost([&] {
      for (int b = 0; b < B; b += 2)
        k->rans_decode2_merged(kBF16, stream(b, out.data() + 2 * (size_t)b * n), mant_of(b), &sa,
                               stream(b + 1, out.data() + 2 * (size_t)(b + 1) * n), mant_of(b + 1), &sb);
      bad |= sa | sb;
    });
    // As dec2_bf16, the second block of each pair with its own table.
    const double d2t = cost([&] {
      for (int b = 0; b < B; b += 2)
        k->rans_decode2_merged(kBF16, stream(b, out.data() + 2 * (size_t)b * n), mant_of(b), &sa,
                               stream(b + 1, out.data() + 2 * (size_t)(b + 1) * n, dec_copy.data()), mant_of(b + 1),
                               &sb);
      bad |= sa | sb;
    });
    if (bad || std::memcmp(out.data(), v.data(), out.size()) != 0) {
      std::fprintf(stderr, "%s: decoded data differs\n", simd_path_name(p));
      return 1;
    }
    std::vector<uint64_t> h(256);
    const uint8_t* src = (const uint8_t*)v.data();
    const double hi = cost([&] { k->histogram(kBF16, 0, src, n * B, h.data()); });
    uint8_t* st[4] = {sym.data(), mant.data(), nullptr, nullptr};
    const double sp = cost([&] { k->split(kBF16, src, n * B, st); });
    uint8_t range[4] = {};
    const double mm = cost([&] { k->minmax(kBF16, 0, src, n * B, range); });
    std::printf("%-9s %7.2f %8.2f %7.2f %8.2f %7.2f %8.2f %9.2f %9.2f %7.2f %7.2f %7.2f  %s\n", simd_path_name(p), e, ew,
                d, dw, d2, db, d2b, d2t, hi, sp, mm, codec_kernels_name(*k));
    }
  }
#if defined(__x86_64__)
  if (simd_path_cpu_has(SimdPath::kAvx2))
    std::printf("AVX2 gather of 8 table entries: %.2f cycles (throughput; the rANS kernels gather once per 8 symbols)\n",
                gather_cycles(dec.data(), ghz));
#endif
  return 0;
}

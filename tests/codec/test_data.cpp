// Real tensors (tests/data, sliced from the training checkpoint in
// ../shared/fixtures by scripts/make_sample.py), casts of them, special
// values, degenerate and incompressible inputs, and compression ratios
// checked against the order-0 entropy of each field.
#include <cfloat>
#include <cmath>
#include <limits>
#include <map>

#include "tz_test_util.h"

using namespace tzt;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// ------------------------------------------------------ the test helpers --

TEST(TestData, SlicesAreTheExpectedRealTensors) {
  const auto& bf = bf16_slice();
  const auto& f32 = fp32_slice();
  ASSERT_EQ(bf.size(), 8u);
  ASSERT_EQ(f32.size(), 12u);
  for (const auto& t : bf) EXPECT_EQ(t.dtype, "BF16") << t.name;
  for (const auto& t : f32) EXPECT_EQ(t.dtype, "F32") << t.name;
  EXPECT_EQ(find_tensor(bf, "blocks.2.qkv.weight").shape, (std::vector<uint64_t>{768, 256}));
  // Adam's second moment is never negative (the README's "sign bit is free").
  for (float v : as_floats_f32(find_tensor(f32, "exp_avg_sq.blocks.2.proj.weight").data))
    ASSERT_FALSE(std::signbit(v));
}

// The fixture README: BF16 weights are the round-to-nearest-even of the FP32
// master weights. This checks the BF16 cast helper against real data.
TEST(TestData, Bf16WeightsAreRneOfMasterWeights) {
  const auto master = as_floats_f32(find_tensor(fp32_slice(), "master.blocks.2.proj.weight").data);
  const Bytes& w = find_tensor(bf16_slice(), "blocks.2.proj.weight").data;
  ASSERT_EQ(w.size(), master.size() * 2);
  EXPECT_EQ(to_bf16(master), w);
  // Truncation instead of rounding would differ on about half the values.
  size_t truncated_equal = 0;
  for (size_t i = 0; i < master.size(); ++i)
    truncated_equal += (uint16_t)(bits_of(master[i]) >> 16) == (uint16_t)(w[2 * i] | w[2 * i + 1] << 8);
  EXPECT_LT(truncated_equal, master.size() * 3 / 4);
}

// The compiler's IEEE half type, where C++ has one (GCC 12: _Float16 on
// x86-64, __fp16 on AArch64).
#if defined(__FLT16_MAX__) && defined(__x86_64__)
#define TZ_COMPILER_HALF _Float16
#elif defined(__aarch64__)
#define TZ_COMPILER_HALF __fp16
#endif

#if defined(TZ_COMPILER_HALF)
// FP16 cast helper against the compiler's own float -> half conversion
// (IEEE round-to-nearest-even) on real values and on edge cases.
TEST(TestData, F16CastMatchesCompiler) {
  std::vector<float> vals = as_floats_f32(concat(fp32_slice()));
  for (uint32_t i = 0; i < 200000; ++i) vals.push_back(float_of((uint32_t)splitmix64(i)));
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e9f, 5.96e-8f, 2.98e-8f, 2.9802322e-8f,
                  6.1035156e-5f, 6.097555e-5f, 1.0009766f, 1.00048828125f, 1.00146484375f, -3.0e-8f})
    vals.push_back(f);
  for (float f : vals) {
    if (std::isnan(f)) continue;
    const TZ_COMPILER_HALF h = (TZ_COMPILER_HALF)f;
    uint16_t ref;
    memcpy(&ref, &h, 2);
    ASSERT_EQ(f32_to_f16(f), ref) << "value " << f << " bits " << std::hex << bits_of(f);
  }
}
#endif

// FP8 helpers: every finite code decodes and re-encodes to itself, and a
// value just above / below the midpoint of two neighbours rounds up / down;
// exact midpoints go to the even code.
TEST(TestData, Fp8CastsRoundToNearestEven) {
  struct Fmt {
    const char* name;
    uint8_t (*enc)(float);
    double (*dec)(uint8_t);
  } fmts[] = {{"e4m3", f32_to_e4m3, e4m3_to_double}, {"e5m2", f32_to_e5m2, e5m2_to_double}};
  for (const auto& f : fmts) {
    SCOPED_TRACE(f.name);
    for (int c = 0; c < 256; ++c) {
      const double v = f.dec((uint8_t)c);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(f.dec(f.enc((float)v))));
        continue;
      }
      ASSERT_EQ(f.enc((float)v), c) << "code " << c << " value " << v;
      if (c == 0x80) continue;  // -0 and +0 share a magnitude
      // Next code up in magnitude, if finite.
      const int next = c + 1;
      if ((next & 0x7F) == 0 || !std::isfinite(f.dec((uint8_t)next))) continue;
      const double w = f.dec((uint8_t)next);
      const double mid = (v + w) / 2;
      EXPECT_EQ(f.enc((float)mid), (c & 1) ? next : c) << "midpoint of codes " << c << " and " << next;
      EXPECT_EQ(f.enc(std::nextafter((float)mid, (float)v)), c);
      EXPECT_EQ(f.enc(std::nextafter((float)mid, (float)w)), next);
    }
  }
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7F);   // no inf in E4M3: overflow is NaN
  EXPECT_EQ(f32_to_e4m3(-1000.0f), 0xFF);
  EXPECT_EQ(f32_to_e4m3(460.0f), 0x7E);    // below the 448/480 midpoint: 448
  EXPECT_EQ(f32_to_e5m2(1e6f), 0x7C);      // +inf
  EXPECT_EQ(f32_to_e5m2(-INFINITY), 0xFC);
  EXPECT_EQ(e4m3_to_double(0x7E), 448.0);
  EXPECT_EQ(e5m2_to_double(0x7B), 57344.0);
  EXPECT_EQ(e4m3_to_double(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(e5m2_to_double(0x01), std::ldexp(1.0, -16));
}

// ------------------------------------------------------------ real data --

TEST(RealData, EachTensorRoundTripsAsItsDtype) {
  for (const auto& t : bf16_slice()) {
    SCOPED_TRACE(t.name);
    for (int level = -1; level <= 3; ++level) ASSERT_TRUE(round_trips(t.data, make_params(TZ_DTYPE_BF16, level)));
  }
  for (const auto& t : fp32_slice()) {
    SCOPED_TRACE(t.name);
    for (int level = -1; level <= 3; ++level) ASSERT_TRUE(round_trips(t.data, make_params(TZ_DTYPE_F32, level)));
  }
}

TEST(RealData, CastsRoundTrip) {
  // FP16 and FP8 casts of the real FP32 values (master weights and Adam
  // moments, unscaled and scaled per tensor), and BF16 casts of the FP32
  // Adam state, which the checkpoint does not store as BF16.
  for (const auto& t : fp32_slice()) {
    SCOPED_TRACE(t.name);
    const auto v = as_floats_f32(t.data);
    ASSERT_TRUE(round_trips(to_f16(v), make_params(TZ_DTYPE_F16, 2, 4096)));
    ASSERT_TRUE(round_trips(to_bf16(v), make_params(TZ_DTYPE_BF16, 2, 4096)));
    ASSERT_TRUE(round_trips(to_f8_e4m3(v), make_params(TZ_DTYPE_F8_E4M3, 2, 4096)));
    ASSERT_TRUE(round_trips(to_f8_e5m2(v), make_params(TZ_DTYPE_F8_E5M2, 2, 4096)));
    ASSERT_TRUE(round_trips(fp8_scaled(v, true), make_params(TZ_DTYPE_F8_E4M3, 1)));
    ASSERT_TRUE(round_trips(fp8_scaled(v, false), make_params(TZ_DTYPE_F8_E5M2, 1)));
  }
}

// Order-0 entropy (bytes) of each field stream of elements [e0, e1) as the
// format splits them (doc/format.md 4, restated here from the bit layouts,
// not from the code).
std::vector<double> field_entropy_bytes(tz_dtype dt, const Bytes& src, size_t e0, size_t e1) {
  const size_t es = elem_size(dt);
  std::vector<std::map<uint8_t, uint64_t>> hist;
  auto add = [&](size_t k, uint8_t s) {
    if (hist.size() <= k) hist.resize(k + 1);
    ++hist[k][s];
  };
  for (size_t i = e0; i < e1; ++i) {
    const uint8_t* p = src.data() + i * es;
    if (dt == TZ_DTYPE_BF16) {
      const uint16_t v = (uint16_t)(p[0] | p[1] << 8);
      add(0, (uint8_t)((v >> 7) & 0xFF));                // exponent
      add(1, (uint8_t)(((v >> 15) << 7) | (v & 0x7F)));  // sign + mantissa
    } else if (dt == TZ_DTYPE_F16) {
      add(0, p[1]);
      add(1, p[0]);
    } else if (dt == TZ_DTYPE_F32) {
      uint32_t v;
      memcpy(&v, p, 4);
      add(0, (uint8_t)(v >> 23));
      add(1, (uint8_t)(((v >> 31) << 7) | ((v >> 16) & 0x7F)));
      add(2, (uint8_t)(v >> 8));
      add(3, (uint8_t)v);
    } else {
      add(0, p[0]);
    }
  }
  std::vector<double> out;
  for (const auto& h : hist) {
    double bits = 0;
    for (const auto& [s, c] : h) bits -= (double)c * std::log2((double)c / (double)(e1 - e0));
    out.push_back(bits / 8);
  }
  return out;
}

// Compressed size is close to the order-0 bound of the fields over the
// whole tensor (each field coded or raw, whichever is smaller), and never
// below the per-block order-0 bound: a static order-0 code of a block
// cannot beat its empirical entropy, and a raw block costs its size.
TEST(RealData, SizeTracksOrder0EntropyOfFields) {
  for (tz_dtype dt : {TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2}) {
    SCOPED_TRACE(dtype_label(dt));
    const Bytes& src = real_data(dt);
    const size_t n = src.size() / elem_size(dt);
    const size_t B = 65536;
    double upper = 0, lower = 0;
    for (double h : field_entropy_bytes(dt, src, 0, n)) upper += std::min(h, (double)n);
    for (size_t e0 = 0; e0 < n; e0 += B) {
      const size_t e1 = std::min(n, e0 + B);
      for (double h : field_entropy_bytes(dt, src, e0, e1)) lower += std::min(h, (double)(e1 - e0));
    }
    const Bytes frame = compress(src, dt, 2);
    ASSERT_FALSE(frame.empty());
    const size_t n_blocks = (n + B - 1) / B;
    // Overhead allowance: 32-byte header, tables (<= 4 * 545 B), index and
    // block headers, 128 B of final rANS states per coded stream and block,
    // plus 0.5% for the 12-bit frequency quantisation.
    const double allowance = 32 + 4 * 545 + n_blocks * (4 + 20 + 4 * 132) + 0.005 * upper;
    EXPECT_LE((double)frame.size(), upper + allowance) << "order-0 bound " << upper << " bytes, got " << frame.size();
    EXPECT_GE((double)frame.size(), lower) << "below the per-block order-0 bound: not lossless?";
    std::printf("  %-8s raw %9zu  order-0 %10.0f  compressed %9zu  ratio %.3f\n", dtype_label(dt).c_str(),
                src.size(), upper, frame.size(), (double)src.size() / frame.size());
  }
}

TEST(RealData, Bf16RatioAbove1_4) {
  // A regression that stores the exponent field raw gives ~1.0 here.
  const Bytes& src = real_data(TZ_DTYPE_BF16);
  for (int level = 1; level <= 3; ++level) {
    const Bytes frame = compress(src, TZ_DTYPE_BF16, level);
    ASSERT_FALSE(frame.empty());
    EXPECT_GT((double)src.size() / frame.size(), 1.4) << "level " << level;
  }
  const Bytes stored = compress(src, TZ_DTYPE_BF16, -1);
  EXPECT_GE(stored.size(), src.size());
}

TEST(RealData, Fp32StateCompresses) {
  // Exponent bytes of real FP32 values are far from uniform: every field
  // layout that codes them must gain at least a few percent.
  const Bytes& src = real_data(TZ_DTYPE_F32);
  const Bytes frame = compress(src, TZ_DTYPE_F32, 1);
  ASSERT_FALSE(frame.empty());
  EXPECT_GT((double)src.size() / frame.size(), 1.05);
}

// -------------------------------------------------------- special values --

// Every 16-bit pattern (all NaN payloads, infinities, zeros, subnormals,
// extremes) as BF16 and F16, in order and shuffled into real data.
TEST(SpecialValues, All16BitPatterns) {
  Bytes all(65536 * 2);
  for (uint32_t v = 0; v < 65536; ++v) {
    all[2 * v] = (uint8_t)v;
    all[2 * v + 1] = (uint8_t)(v >> 8);
  }
  for (tz_dtype dt : {TZ_DTYPE_BF16, TZ_DTYPE_F16}) {
    for (int level = -1; level <= 3; ++level) {
      ASSERT_TRUE(round_trips(all, make_params(dt, level))) << dtype_label(dt) << " level " << level;
      ASSERT_TRUE(round_trips(all, make_params(dt, level, 4096))) << dtype_label(dt) << " level " << level;
    }
    // Sparse specials inside real data: rare symbols in a skewed table.
    Bytes mixed = real_data(dt);
    for (size_t i = 0, v = 0; i + 1 < mixed.size(); i += 2 * 97, v = (v + 331) & 0xFFFF) {
      mixed[i] = (uint8_t)v;
      mixed[i + 1] = (uint8_t)(v >> 8);
    }
    for (int level = 1; level <= 3; ++level) ASSERT_TRUE(round_trips(mixed, make_params(dt, level)));
  }
}

TEST(SpecialValues, All8BitPatterns) {
  Bytes all(256 * 40);
  for (size_t i = 0; i < all.size(); ++i) all[i] = (uint8_t)(i * 167);
  for (tz_dtype dt : {TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2, TZ_DTYPE_BYTES})
    for (int level = -1; level <= 3; ++level) ASSERT_TRUE(round_trips(all, make_params(dt, level)));
}

TEST(SpecialValues, Float32Specials) {
  const uint32_t specials[] = {
      0x00000000u, 0x80000000u,                // +0, -0
      0x7F800000u, 0xFF800000u,                // +inf, -inf
      0x7FC00000u, 0xFFC00000u,                // quiet NaN, negative quiet NaN
      0x7F800001u, 0x7FA5A5A5u, 0xFFBFFFFFu,   // signalling NaNs with payloads
      0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FC12345u,   // NaN payloads
      0x00000001u, 0x80000001u, 0x007FFFFFu,   // subnormals
      0x00800000u, 0x80800000u,                // smallest normals
      0x7F7FFFFFu, 0xFF7FFFFFu,                // +-FLT_MAX
      0x3F800000u, 0xBF800000u, 0x34000000u};  // 1, -1, FLT_EPSILON
  std::vector<float> only;
  for (uint32_t s : specials) only.push_back(float_of(s));
  Bytes specials_bytes(only.size() * 4);
  memcpy(specials_bytes.data(), only.data(), specials_bytes.size());
  // Alone, repeated across blocks, and sprinkled into real Adam state.
  Bytes repeated = tile(specials_bytes, 4 * (65536 + 123));
  Bytes mixed = real_data(TZ_DTYPE_F32);
  for (size_t i = 0, k = 0; i + 4 <= mixed.size(); i += 4 * 61, k = (k + 1) % std::size(specials))
    memcpy(mixed.data() + i, &specials[k], 4);
  for (int level = -1; level <= 3; ++level) {
    for (const Bytes* b : {&specials_bytes, &repeated, &mixed}) {
      ASSERT_TRUE(round_trips(*b, make_params(TZ_DTYPE_F32, level)));
      ASSERT_TRUE(round_trips(*b, make_params(TZ_DTYPE_F32, level, 4096)));
    }
  }
  // The casts of the same specials to the narrow types round-trip too.
  ASSERT_TRUE(round_trips(to_f16(only), make_params(TZ_DTYPE_F16, 2)));
  ASSERT_TRUE(round_trips(to_bf16(only), make_params(TZ_DTYPE_BF16, 2)));
  ASSERT_TRUE(round_trips(to_f8_e4m3(only), make_params(TZ_DTYPE_F8_E4M3, 2)));
  ASSERT_TRUE(round_trips(to_f8_e5m2(only), make_params(TZ_DTYPE_F8_E5M2, 2)));
}

// ----------------------------------------------------- degenerate inputs --

TEST(Degenerate, AllZeros) {
  for (tz_dtype dt : kAllDtypes) {
    SCOPED_TRACE(dtype_label(dt));
    const Bytes zeros(size_t(3) << 20, 0);
    Bytes frame;
    ASSERT_TRUE(round_trips(zeros, make_params(dt, 1), &frame));
    // Each field is a single symbol: only states, headers and tables remain.
    EXPECT_LT(frame.size(), zeros.size() / 20) << "all-zero input barely compressed";
  }
  // One value repeated (a single-symbol table per field), and negative zeros.
  Bytes ones = tile({0x80, 0x3F}, size_t(1) << 20);  // BF16 1.0
  ASSERT_TRUE(round_trips(ones, make_params(TZ_DTYPE_BF16, 1)));
  Bytes negz = tile({0x00, 0x00, 0x00, 0x80}, size_t(1) << 20);
  ASSERT_TRUE(round_trips(negz, make_params(TZ_DTYPE_F32, 1)));
}

TEST(Degenerate, IncompressibleBytes) {
  for (tz_dtype dt : kAllDtypes) {
    for (size_t n : {size_t(1000), size_t(1) << 20, size_t(5) << 20}) {
      SCOPED_TRACE(dtype_label(dt) + " " + std::to_string(n));
      const Bytes src = hash_stream(n, 42 + n);
      for (int level = -1; level <= 3; ++level) {
        Bytes frame;
        ASSERT_TRUE(round_trips(src, make_params(dt, level), &frame));
        EXPECT_LE((double)frame.size(), (double)n * 1.005 + 256) << "level " << level;
      }
    }
  }
}

TEST(Degenerate, TwoValueAlternation) {
  // Skewed but not degenerate: symbol frequencies far from powers of two.
  Bytes src(200000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (splitmix64(i) % 1000) < 3 ? 0x81 : 0x01;
  for (tz_dtype dt : {TZ_DTYPE_F8_E4M3, TZ_DTYPE_BF16, TZ_DTYPE_F32}) {
    Bytes frame;
    ASSERT_TRUE(round_trips(src, make_params(dt, 2, 4096), &frame));
  }
}

}  // namespace

// Checkpoint-aware coding (doc/container.md section 12): the element-wise
// predictors of src/codec/predict.h, cast and delta prediction in .tzip
// files, references, rebase, and the real step200 -> step400 fixture pair.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <xxhash.h>
#include <zstd.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "codec/predict.h"
#include "tensorzip/container.hpp"
#include "tz_test_files.hpp"       // tests/support
#include "tz_test_tzip_edit.hpp"  // tests/support

namespace tc = tz::container;
namespace tp = tz::predict;
using namespace tz_test;

namespace {

bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

struct T {
  std::string name, dtype, shape;
  Bytes data;
};
void write_st(const std::string& path, const std::vector<T>& ts) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  Bytes data;
  for (const auto& t : ts) {
    const size_t b = data.size();
    data.insert(data.end(), t.data.begin(), t.data.end());
    h += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":" + t.shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(data.size()) + "]}";
  }
  h += "}";
  while ((8 + h.size()) % 8) h += ' ';
  Bytes out(8);
  for (int i = 0; i < 8; ++i) out[i] = (uint8_t)((uint64_t)h.size() >> (8 * i));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  write_all(path, out);
}

uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// n FP32 values ~ N(0, scale) as bytes.
Bytes normal_f32(size_t n, float scale, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  Bytes b(n * 4);
  for (size_t i = 0; i < n; ++i) {
    const float v = d(g);
    std::memcpy(&b[4 * i], &v, 4);
  }
  return b;
}
Bytes cast_of(const Bytes& f32, int kind) {
  Bytes b(f32.size() / 2);
  for (size_t i = 0; i < f32.size() / 4; ++i) {
    uint32_t u;
    std::memcpy(&u, &f32[4 * i], 4);
    const uint16_t v = tp::cast_f32(u, kind);
    std::memcpy(&b[2 * i], &v, 2);
  }
  return b;
}

// Independent reference for BF16 RNE: the two neighbours in double precision.
uint16_t bf16_reference(uint32_t x) {
  const float f = u2f(x);
  if (std::isnan(f)) return 0x7FC0;
  if (std::isinf(f)) return (uint16_t)(x >> 16);
  const uint16_t lo = (uint16_t)(x >> 16);  // truncation toward zero
  const uint16_t hi = (uint16_t)(lo + 1);   // next magnitude (may be inf)
  const double dl = std::fabs((double)f - (double)u2f((uint32_t)lo << 16));
  // Past the largest finite BF16 the next "value" is 2^128 (IEEE overflow rule).
  const double vh = (hi & 0x7FFF) == 0x7F80 ? std::ldexp(f < 0 ? -1.0 : 1.0, 128) : (double)u2f((uint32_t)hi << 16);
  const double dh = std::fabs(vh - (double)f);
  if ((x & 0xFFFF) == 0) return lo;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

class Predict : public DirTest {
 protected:
  std::string tag() const override { return "tz_predict"; }
  void roundtrip(const std::string& tz, const std::string& orig, const tc::ReadOptions& ro = {}) {
    tc::Reader r(tz);
    tc::ReadOptions o = ro;
    o.force = true;
    r.export_safetensors(p("rt.safetensors"), o);
    EXPECT_EQ(read_all(p("rt.safetensors")), read_all(orig)) << tz;
  }
};

const tc::TensorEntry& entry(const tc::Reader& r, const std::string& name) {
  const long i = r.find(name);
  EXPECT_GE(i, 0) << name;
  return r.tensors()[(size_t)i];
}

uint16_t preamble_major(const std::string& path) {
  const Bytes b = read_all(path);
  return (uint16_t)(b[4] | (b[5] << 8));
}

}  // namespace

// ---- element-wise predictors (host side of the TZ_HD code) -----------------

TEST(PredictH, Bf16RneMatchesIndependentReference) {
  std::vector<uint32_t> xs = {0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F7F8000u,
                              0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00008000u, 0x00018000u, 0x3F808000u,
                              0x3F818000u, 0x3F807FFFu, 0x3F808001u};
  for (uint64_t x = 0; x < (1ull << 32); x += 65521) xs.push_back((uint32_t)x);
  std::mt19937 g(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t hi = g() & 0xFFFF0000u;
    xs.push_back(hi | 0x8000u);  // exact ties
    xs.push_back(hi | (g() & 0xFFFF));
  }
  for (uint32_t x : xs) {
    if (std::isnan(u2f(x))) continue;
    ASSERT_EQ(tp::f32_to_bf16_rne(x), bf16_reference(x)) << std::hex << x;
  }
  // Overflow of the largest finite values rounds to infinity, as RNE must.
  EXPECT_EQ(tp::f32_to_bf16_rne(0x7F7FFFFFu), 0x7F80u);
  EXPECT_EQ(tp::f32_to_bf16_rne(0x80000000u), 0x8000u);  // -0 stays -0
  // Every NaN (either sign, any payload, signalling or quiet) -> 0x7FC0.
  for (uint32_t n : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F810000u})
    EXPECT_EQ(tp::f32_to_bf16_rne(n), 0x7FC0u) << std::hex << n;
}

#if defined(__FLT16_MAX__)
TEST(PredictH, F16RneMatchesCompilerConversion) {
  auto check = [](uint32_t x) {
    const float f = u2f(x);
    if (std::isnan(f)) return;
    const _Float16 h = (_Float16)f;
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(tp::f32_to_f16_rne(x), hb) << std::hex << x;
  };
  for (uint64_t x = 0; x < (1ull << 32); x += 4099) check((uint32_t)x);
  // Around every binary16 boundary: subnormals, the normal range, overflow.
  for (uint32_t e = 100; e <= 144; ++e)
    for (uint32_t m : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7FFFFFu, 0x400000u, 0x3FFFFFu, 0x401000u})
      for (uint32_t s : {0u, 0x80000000u}) check(s | (e << 23) | m);
  EXPECT_EQ(tp::f32_to_f16_rne(f2u(65504.f)), 0x7BFFu);
  EXPECT_EQ(tp::f32_to_f16_rne(f2u(65520.f)), 0x7C00u);
  EXPECT_EQ(tp::f32_to_f16_rne(0xFFC00001u), 0xFE00u);  // NaN keeps its sign, payload dropped
}
#endif

TEST(PredictH, XorAndCastXorAreInvolutions) {
  const Bytes f = normal_f32(1001, 0.02f, 3);
  Bytes v = cast_of(f, tp::kCastBF16), orig = v;
  v[10] ^= 0x5A;
  const Bytes actual = v;
  tp::cast_xor(f.data(), v.data(), 1001, tp::kCastBF16);  // -> residual
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], i == 10 ? 0x5A : 0) << i;
  tp::cast_xor(f.data(), v.data(), 1001, tp::kCastBF16);  // -> value
  EXPECT_EQ(v, actual);
  Bytes a = f, b = normal_f32(1001, 0.02f, 4);
  tp::xor_bytes(b.data(), a.data(), a.size());
  tp::xor_bytes(b.data(), a.data(), a.size());
  EXPECT_EQ(a, f);
}

// ---- cast prediction inside one file ---------------------------------------

TEST_F(Predict, CastWithinFileExactAndInexactRoundTrip) {
  const size_t n = 700000;  // 2.8 MB FP32: several 1 MiB frames
  const Bytes master = normal_f32(n, 0.02f, 1);
  Bytes master2 = normal_f32(n, 0.05f, 2);
  Bytes w_exact = cast_of(master, tp::kCastBF16);
  Bytes w_inexact = cast_of(master2, tp::kCastBF16);
  Bytes h16 = cast_of(master, tp::kCastF16);
  // Perturbed masters: flip low mantissa bits of the master after the cast
  // (the cast result usually stays, sometimes changes) and some BF16 values
  // directly, so the prediction is wrong in a few places.
  std::mt19937 g(9);
  for (int k = 0; k < 500; ++k) master2[4 * (g() % n) + 1] ^= (uint8_t)(1u << (g() % 8));
  for (int k = 0; k < 300; ++k) w_inexact[2 * (g() % n)] ^= 1;
  const std::string shape = "[" + std::to_string(n) + "]";
  // Names differ from the sources: discovery matches by value, not by name.
  write_st(p("a.safetensors"), {{"weight_b", "BF16", shape, w_inexact},
                                {"weight_a", "BF16", shape, w_exact},
                                {"half", "F16", shape, h16},
                                {"opt.m1", "F32", shape, master},
                                {"opt.m2", "F32", shape, master2},
                                {"unrelated", "BF16", shape, cast_of(normal_f32(n, 0.02f, 77), tp::kCastBF16)}});
  tc::WriteOptions o;
  o.chunk_bytes = 1u << 20;
  o.threads = 3;
  tc::compress_file(p("a.safetensors"), p("a.tzip"), o);
  tc::Reader r(p("a.tzip"));
  EXPECT_EQ(r.version_major(), 2);
  EXPECT_EQ(preamble_major(p("a.tzip")), 2);
  EXPECT_TRUE(r.references().empty());
  const auto& wa = entry(r, "weight_a");
  EXPECT_EQ(wa.predict.kind, tc::PredictKind::kCast);
  EXPECT_EQ(wa.predict.source, "opt.m1");
  EXPECT_EQ(wa.predict.ref, -1);
  // Exact prediction: every residual chunk is all zero, stored as size-0 frames.
  EXPECT_EQ(wa.compressed_size(), 0u);
  ASSERT_EQ(wa.frames.size(), 2u);  // 1.4 MB in 1 MiB chunks
  for (const auto& f : wa.frames) EXPECT_EQ(f.size, 0u);
  const auto& wb = entry(r, "weight_b");
  EXPECT_EQ(wb.predict.kind, tc::PredictKind::kCast);
  EXPECT_EQ(wb.predict.source, "opt.m2");
  EXPECT_LT(wb.compressed_size(), wb.raw_size() / 20);  // ~800 exceptions cost only their own bits
  EXPECT_GT(wb.compressed_size(), 0u);
  EXPECT_EQ(entry(r, "half").predict.kind, tc::PredictKind::kCast);
  EXPECT_EQ(entry(r, "unrelated").predict.kind, tc::PredictKind::kNone);
  EXPECT_EQ(entry(r, "opt.m1").predict.kind, tc::PredictKind::kNone);
  roundtrip(p("a.tzip"), p("a.safetensors"));
  r.verify(p("a.safetensors"), tc::ReadOptions{});

  // Random access of a predicted tensor: whole, block ranges, byte ranges
  // spanning frames.
  const Bytes orig = read_all(p("a.safetensors"));
  const tc::SafetensorsInfo st = tc::read_safetensors_info(p("a.safetensors"));
  for (const char* name : {"weight_a", "weight_b", "half"}) {
    const long i = r.find(name);
    const auto& t = r.tensors()[(size_t)i];
    const Bytes want(orig.begin() + (long)(st.data_start + t.data_begin), orig.begin() + (long)(st.data_start + t.data_end));
    EXPECT_EQ(r.read_tensor(name), want) << name;
    for (auto [off, len] : {std::pair<uint64_t, uint64_t>{0, 10}, {131071, 3}, {(1u << 20) - 5, 17}, {t.raw_size() - 7, 7}}) {
      Bytes got(len);
      r.read_range((size_t)i, off, len, got.data());
      EXPECT_EQ(got, Bytes(want.begin() + (long)off, want.begin() + (long)(off + len))) << name << " " << off;
    }
    Bytes blk(2 * t.block_bytes());
    const size_t w = r.read_blocks((size_t)i, 3, 2, blk.data(), blk.size());
    ASSERT_EQ(w, blk.size());
    EXPECT_EQ(blk, Bytes(want.begin() + (long)(3 * t.block_bytes()), want.begin() + (long)(5 * t.block_bytes())));
  }

  // --no-predict: plain version-1 file, larger, same content.
  o.predict = false;
  tc::compress_file(p("a.safetensors"), p("plain.tzip"), o);
  EXPECT_EQ(preamble_major(p("plain.tzip")), 1);
  EXPECT_GT(read_all(p("plain.tzip")).size(), read_all(p("a.tzip")).size() * 12 / 10);
  roundtrip(p("plain.tzip"), p("a.safetensors"));
}

TEST_F(Predict, SpecialValuesInMasters) {
  // NaN (payloads, both signs), infinities, -0, subnormals, values that
  // overflow BF16/F16, ties; BF16 from the RNE rule, plus a second BF16
  // whose NaNs keep their sign (what a different framework might write):
  // those elements are exceptions and must still round-trip.
  std::vector<uint32_t> sp = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFA00000u, 0x7F800000u, 0xFF800000u,
                              0x80000000u, 0x00000000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0x477FF000u,
                              0x477FEFFFu, 0x33000000u, 0x33000001u, 0x3F808000u, 0x3F818000u, 0xC7800000u};
  Bytes master = normal_f32(65536, 1.0f, 5);
  for (size_t i = 0; i < 65536; i += 37) {
    const uint32_t v = sp[(i / 37) % sp.size()];
    std::memcpy(&master[4 * i], &v, 4);
  }
  Bytes bf = cast_of(master, tp::kCastBF16), bf_signed = bf, h16 = cast_of(master, tp::kCastF16);
  for (size_t i = 0; i < 65536; ++i) {
    uint32_t u;
    std::memcpy(&u, &master[4 * i], 4);
    if (std::isnan(u2f(u))) {
      const uint16_t s = (uint16_t)((u >> 16) | 0x0040);
      std::memcpy(&bf_signed[2 * i], &s, 2);
    }
  }
  write_st(p("s.safetensors"), {{"m", "F32", "[256,256]", master},
                                {"b", "BF16", "[256,256]", bf},
                                {"bs", "BF16", "[256,256]", bf_signed},
                                {"h", "F16", "[256,256]", h16}});
  tc::compress_file(p("s.safetensors"), p("s.tzip"), tc::WriteOptions{});
  tc::Reader r(p("s.tzip"));
  for (const char* n : {"b", "bs", "h"}) EXPECT_EQ(entry(r, n).predict.kind, tc::PredictKind::kCast) << n;
  roundtrip(p("s.tzip"), p("s.safetensors"));
}

// ---- across files and checkpoints ------------------------------------------

struct Ckpt {
  Bytes master, m, v;
};
Ckpt make_ckpt(uint32_t seed) {
  return Ckpt{normal_f32(300000, 0.02f, seed), normal_f32(300000, 1e-3f, seed + 1), normal_f32(300000, 1e-6f, seed + 2)};
}
// Next checkpoint: the master weights move a little (a small multiplicative
// step keeps sign and exponent mostly), moments are new.
Ckpt step(const Ckpt& c, uint32_t seed) {
  Ckpt n = c;
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1e-3f);
  for (size_t i = 0; i < 300000; ++i) {
    float f;
    std::memcpy(&f, &c.master[4 * i], 4);
    f *= 1.f + d(g);
    std::memcpy(&n.master[4 * i], &f, 4);
  }
  n.m = normal_f32(300000, 1e-3f, seed + 1);
  n.v = normal_f32(300000, 1e-6f, seed + 2);
  return n;
}
void write_ckpt(const std::string& model, const std::string& optim, const Ckpt& c) {
  write_st(model, {{"model.w", "BF16", "[600,500]", cast_of(c.master, tp::kCastBF16)}});
  write_st(optim, {{"state.0.master", "F32", "[600,500]", c.master},
                   {"state.0.exp_avg", "F32", "[600,500]", c.m},
                   {"state.0.exp_avg_sq", "F32", "[600,500]", c.v}});
}

TEST_F(Predict, CrossFileCastDeltaChainMissingAndWrongReferences) {
  mkdir(p("c1").c_str(), 0755);
  mkdir(p("c2").c_str(), 0755);
  mkdir(p("c3").c_str(), 0755);
  const Ckpt c1 = make_ckpt(11), c2 = step(c1, 12), c3 = step(c2, 13);
  write_ckpt(p("model1.safetensors"), p("optim1.safetensors"), c1);
  write_ckpt(p("model2.safetensors"), p("optim2.safetensors"), c2);
  write_ckpt(p("model3.safetensors"), p("optim3.safetensors"), c3);
  tc::WriteOptions o;
  o.threads = 2;
  // Model listed first: the optimizer file is still written first (source).
  tc::compress_checkpoint({p("model1.safetensors"), p("optim1.safetensors")}, {p("c1/model.tzip"), p("c1/optim.tzip")}, o);
  tc::compress_checkpoint({p("model2.safetensors"), p("optim2.safetensors")}, {p("c2/model.tzip"), p("c2/optim.tzip")}, o,
                          {p("c1/model.tzip"), p("c1/optim.tzip")});
  tc::compress_checkpoint({p("model3.safetensors"), p("optim3.safetensors")}, {p("c3/model.tzip"), p("c3/optim.tzip")}, o,
                          {"", p("c2/optim.tzip")});
  {
    tc::Reader m(p("c1/model.tzip"));
    const auto& t = entry(m, "model.w");
    EXPECT_EQ(t.predict.kind, tc::PredictKind::kCast);
    EXPECT_EQ(t.predict.source, "state.0.master");
    ASSERT_EQ(m.references().size(), 1u);
    EXPECT_EQ(m.references()[0].file, "optim.tzip");
    EXPECT_EQ(m.references()[0].xxh64, tc::Reader(p("c1/optim.tzip")).file_checksum());
    tc::Reader o2(p("c2/optim.tzip"));
    EXPECT_EQ(entry(o2, "state.0.master").predict.kind, tc::PredictKind::kDelta);
    ASSERT_EQ(o2.references().size(), 1u);
    EXPECT_EQ(o2.references()[0].file, "../c1/optim.tzip");
    // Fresh Adam moments do not pay as deltas.
    EXPECT_EQ(entry(o2, "state.0.exp_avg_sq").predict.kind, tc::PredictKind::kNone);
  }
  // Every file round-trips, c3 through the chain c3 -> c2 -> c1.
  for (int k = 1; k <= 3; ++k) {
    roundtrip(p("c" + std::to_string(k) + "/model.tzip"), p("model" + std::to_string(k) + ".safetensors"));
    roundtrip(p("c" + std::to_string(k) + "/optim.tzip"), p("optim" + std::to_string(k) + ".safetensors"));
  }
  // Random access of a delta tensor at the end of a chain.
  {
    tc::Reader r(p("c3/optim.tzip"));
    Bytes got(64);
    r.read_range((size_t)r.find("state.0.master"), 400000, 64, got.data());
    EXPECT_EQ(got, Bytes(c3.master.begin() + 400000, c3.master.begin() + 400064));
    tc::Reader mr(p("c3/model.tzip"));
    EXPECT_EQ(mr.read_tensor("model.w"), cast_of(c3.master, tp::kCastBF16));
  }

  // Missing reference: one line naming both files, nothing written.
  rename(p("c1/optim.tzip").c_str(), p("moved.tzip").c_str());
  try {
    tc::Reader r(p("c3/optim.tzip"));
    r.export_safetensors(p("x.safetensors"), tc::ReadOptions{});
    ADD_FAILURE() << "missing reference not detected";
  } catch (const tc::Error& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.kind(), tc::ErrorKind::kIO) << w;
    EXPECT_NE(w.find("c2/optim.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("c1/optim.tzip"), std::string::npos) << w;
    EXPECT_EQ(w.find('\n'), std::string::npos) << w;
  }
  EXPECT_FALSE(exists(p("x.safetensors")));
  // ... and found when its location is given (matched by checksum).
  {
    tc::Reader r(p("c2/optim.tzip"));
    tc::ReadOptions ro;
    ro.refs = {p("moved.tzip")};
    tc::ReadOptions rr = ro;
    rr.force = true;
    r.export_safetensors(p("x.safetensors"), rr);
    EXPECT_EQ(read_all(p("x.safetensors")), read_all(p("optim2.safetensors")));
    // A file that is not one of its references is refused by name.
    tc::Reader r2(p("c2/optim.tzip"));
    try {
      r2.add_reference_path(p("c3/optim.tzip"));
      ADD_FAILURE();
    } catch (const tc::Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not a reference"), std::string::npos) << e.what();
    }
  }
  // Wrong reference under the recorded name: refused, naming both files.
  write_all(p("c1/optim.tzip"), read_all(p("c3/optim.tzip")));
  try {
    tc::Reader r(p("c2/optim.tzip"));
    r.read_tensor("state.0.master");
    ADD_FAILURE() << "wrong reference not detected";
  } catch (const tc::Error& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << w;
    EXPECT_NE(w.find("c2/optim.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("c1/optim.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("not the file"), std::string::npos) << w;
  }
  // verify checks references too.
  EXPECT_THROW(tc::Reader(p("c2/optim.tzip")).verify("", tc::ReadOptions{}), tc::Error);

  // Rebase: standalone copies need no other file.
  rename(p("moved.tzip").c_str(), p("c1/optim.tzip").c_str());
  tc::rebase(p("c3/optim.tzip"), p("standalone-optim3.tzip"), tc::WriteOptions{});
  tc::rebase(p("c3/model.tzip"), p("standalone-model3.tzip"), tc::WriteOptions{});
  for (const char* f : {"standalone-optim3.tzip", "standalone-model3.tzip"}) {
    tc::Reader r(p(f));
    EXPECT_TRUE(r.references().empty()) << f;
    EXPECT_EQ(r.version_major(), 1) << f;
  }
  std::system(("rm -rf '" + p("c1") + "' '" + p("c2") + "' '" + p("c3") + "'").c_str());
  roundtrip(p("standalone-optim3.tzip"), p("optim3.safetensors"));
  roundtrip(p("standalone-model3.tzip"), p("model3.safetensors"));
}

TEST_F(Predict, FolderOfCheckpointFilesPredictsAcrossFiles) {
  mkdir(p("ck").c_str(), 0755);
  const Ckpt c = make_ckpt(21);
  write_ckpt(p("ck/a-model.safetensors"), p("ck/b-optim.safetensors"), c);
  write_all(p("ck/config.json"), Bytes{'{', '}'});
  tc::compress_folder(p("ck"), p("ck.tzip"), tc::WriteOptions{});
  tc::Reader m(p("ck.tzip/a-model.tzip"));
  EXPECT_EQ(entry(m, "model.w").predict.kind, tc::PredictKind::kCast);
  ASSERT_EQ(m.references().size(), 1u);
  EXPECT_EQ(m.references()[0].file, "b-optim.tzip");
  tc::decompress_folder(p("ck.tzip"), p("out"), tc::ReadOptions{});
  for (const char* f : {"a-model.safetensors", "b-optim.safetensors", "config.json"})
    EXPECT_EQ(read_all(p("out/") + f), read_all(p("ck/") + f)) << f;
}

TEST_F(Predict, DecompressCheckpointRestoresSourcesFirstAndUsesThem) {
  mkdir(p("z").c_str(), 0755);
  mkdir(p("out").c_str(), 0755);
  const Ckpt c = make_ckpt(31);
  write_ckpt(p("model.safetensors"), p("optim.safetensors"), c);
  tc::compress_checkpoint({p("model.safetensors"), p("optim.safetensors")}, {p("z/model.tzip"), p("z/optim.tzip")},
                          tc::WriteOptions{});
  // The model file is listed first but needs the optimizer file.
  tc::decompress_checkpoint({p("z/model.tzip"), p("z/optim.tzip")}, {p("out/model.safetensors"), p("out/optim.safetensors")},
                            tc::ReadOptions{});
  EXPECT_EQ(read_all(p("out/model.safetensors")), read_all(p("model.safetensors")));
  EXPECT_EQ(read_all(p("out/optim.safetensors")), read_all(p("optim.safetensors")));
  // Predictors come from the restored optimizer file: once it is restored,
  // the model file decodes even if the optimizer .tzip then disappears.
  tc::Reader m(p("z/model.tzip"));
  m.add_reference_original(p("z/optim.tzip"), p("out/optim.safetensors"));
  rename(p("z/optim.tzip").c_str(), p("gone.tzip").c_str());
  EXPECT_EQ(m.read_tensor("model.w"), cast_of(c.master, tp::kCastBF16));
  tc::ReadOptions f;
  f.force = true;
  m.export_safetensors(p("again.safetensors"), f);
  EXPECT_EQ(read_all(p("again.safetensors")), read_all(p("model.safetensors")));
}

// ---- hostile version-2 headers ---------------------------------------------

// with_header (tests/support/tz_test_tzip_edit.hpp) rewrites the JSON header and
// fixes every checksum, so that the header validation itself must catch the edit.

TEST_F(Predict, HeaderValidationOfPredictions) {
  const Bytes m = normal_f32(4096, 0.02f, 41);
  write_st(p("h.safetensors"), {{"w", "BF16", "[64,64]", cast_of(m, tp::kCastBF16)},
                                {"m", "F32", "[64,64]", m},
                                {"v", "F32", "[64,64]", normal_f32(4096, 1.f, 42)}});
  tc::compress_file(p("h.safetensors"), p("h.tzip"), tc::WriteOptions{});
  tc::WriteOptions plain;
  plain.predict = false;
  tc::compress_file(p("h.safetensors"), p("h1.tzip"), plain);
  const Bytes good = read_all(p("h.tzip")), v1 = read_all(p("h1.tzip"));
  write_all(p("same.tzip"), with_header(good, [](nlohmann::json&) {}));
  ASSERT_NO_THROW(tc::Reader(p("same.tzip")).verify(p("h.safetensors"), tc::ReadOptions{}));
  using J = nlohmann::json;
  auto w = [](J& j) -> J& { return j["tensors"][0]; };  // "w", the cast
  const std::vector<std::tuple<const char*, const Bytes*, std::function<void(J&)>>> edits = {
      {"predict in a version 1 file", &v1, [&](J& j) { w(j)["predict"] = {{"kind", "cast"}, {"source", "m"}}; }},
      {"references in a version 1 file", &v1, [](J& j) { j["references"] = J::array(); }},
      {"references missing", &good, [](J& j) { j.erase("references"); }},
      {"json version 1 in a 2.0 file", &good, [](J& j) { j["version"] = 1; }},
      {"unknown kind", &good, [&](J& j) { w(j)["predict"]["kind"] = "lerp"; }},
      {"unknown key", &good, [&](J& j) { w(j)["predict"]["scale"] = 2; }},
      {"ref out of range", &good, [&](J& j) { w(j)["predict"]["ref"] = 0; }},
      {"delta without ref", &good, [&](J& j) { w(j)["predict"] = {{"kind", "delta"}}; }},
      {"source missing", &good, [&](J& j) { w(j)["predict"]["source"] = "nope"; }},
      {"source empty", &good, [&](J& j) { w(j)["predict"]["source"] = ""; }},
      {"source is the tensor itself", &good, [&](J& j) { w(j)["predict"]["source"] = "w"; }},
      {"cast of an F32 tensor", &good, [](J& j) { j["tensors"][1]["predict"] = {{"kind", "cast"}, {"source", "v"}}; }},
      {"reference without checksum", &good, [](J& j) { j["references"] = J::array({{{"file", "x.tzip"}}}); }},
      {"reference bad checksum", &good,
       [](J& j) { j["references"] = J::array({{{"file", "x.tzip"}, {"xxh64", "XYZ"}}}); }},
      {"reference without name", &good,
       [](J& j) { j["references"] = J::array({{{"file", ""}, {"xxh64", "0123456789abcdef"}}}); }},
      {"predict on a gap-less non-object", &good, [&](J& j) { w(j)["predict"] = 3; }},
      {"empty frame of a plain tensor", &v1, [](J& j) { j["tensors"][0]["frames"][0]["size"] = 0; }},
      {"empty frame, prediction removed", &good, [&](J& j) { w(j).erase("predict"); }},
  };
  for (const auto& [what, base, edit] : edits) {
    write_all(p("e.tzip"), with_header(*base, edit));
    try {
      tc::Reader r(p("e.tzip"), 1);
      r.verify("", tc::ReadOptions{});
      ADD_FAILURE() << what << ": accepted";
    } catch (const tc::Error& e) {
      EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("header"), std::string::npos) << what << ": " << e.what();
    }
  }
  // Checks that need the referenced file happen when the prediction is used:
  // a cast whose source is not in the reference, a delta whose reference
  // tensor has another shape.
  write_st(p("r.safetensors"), {{"m", "F32", "[64,64]", m}, {"v", "F32", "[4096]", normal_f32(4096, 1.f, 42)}});
  tc::compress_file(p("r.safetensors"), p("r.tzip"), plain);
  write_st(p("x.safetensors"), {{"w", "BF16", "[64,64]", cast_of(m, tp::kCastBF16)}});
  tc::compress_checkpoint({p("x.safetensors"), p("r.safetensors")}, {p("x.tzip"), p("r2.tzip")}, tc::WriteOptions{});
  const Bytes x = read_all(p("x.tzip"));
  ASSERT_EQ(tc::Reader(p("x.tzip")).references().size(), 1u);
  for (const char* src : {"nope", "v"}) {
    write_all(p("e.tzip"), with_header(x, [&](J& j) { j["tensors"][0]["predict"]["source"] = src; }));
    tc::Reader r(p("e.tzip"), 1);
    try {
      r.read_tensor("w");
      ADD_FAILURE() << src << ": accepted";
    } catch (const tc::Error& e) {
      EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << e.what();
      EXPECT_NE(std::string(e.what()).find("r2.tzip"), std::string::npos) << e.what();
    }
  }
}

// ---- the real checkpoint pair ----------------------------------------------

TEST_F(Predict, FixtureStep200ToStep400AndASyntheticThird) {
  const std::string fx = TZ_SHARED_FIXTURES_DIR;
  const std::string m2 = fx + "/gpt-small-step200-model-bf16.safetensors", o2 = fx + "/gpt-small-step200-optim-fp32.safetensors";
  const std::string m4 = fx + "/gpt-small-step400-model-bf16.safetensors", o4 = fx + "/gpt-small-step400-optim-fp32.safetensors";
  if (!exists(m2) || !exists(o4)) GTEST_SKIP() << "fixtures not present in " << fx;
  for (const char* d : {"s200", "s400", "s400d", "s600"}) mkdir(p(d).c_str(), 0755);
  tc::WriteOptions o;
  tc::compress_checkpoint({m2, o2}, {p("s200/model.tzip"), p("s200/optim.tzip")}, o);
  const tc::PassStats alone = tc::compress_checkpoint({m4, o4}, {p("s400/model.tzip"), p("s400/optim.tzip")}, o);
  const tc::PassStats delta = tc::compress_checkpoint({m4, o4}, {p("s400d/model.tzip"), p("s400d/optim.tzip")}, o,
                                                      {p("s200/model.tzip"), p("s200/optim.tzip")});
  tc::WriteOptions plain = o;
  plain.predict = false;
  mkdir(p("plain").c_str(), 0755);
  const tc::PassStats base = tc::compress_checkpoint({m4, o4}, {p("plain/model.tzip"), p("plain/optim.tzip")}, plain);
  // Every BF16 weight is an exact RNE cast of its master (fixture README).
  tc::Reader mr(p("s400/model.tzip"));
  for (const auto& t : mr.tensors()) {
    EXPECT_EQ(t.predict.kind, tc::PredictKind::kCast) << t.name;
    EXPECT_EQ(t.predict.source, "master." + t.name);
  }
  tc::Reader od(p("s400d/optim.tzip"));
  size_t n_delta = 0;
  for (const auto& t : od.tensors()) n_delta += t.predict.kind == tc::PredictKind::kDelta;
  EXPECT_GT(n_delta, 0u);
  EXPECT_LT(alone.file_bytes, base.file_bytes * 90 / 100);  // model file ~free: 1.25x -> ~1.42x
  EXPECT_LT(delta.file_bytes, alone.file_bytes);
  roundtrip(p("s400/model.tzip"), m4);
  roundtrip(p("s400/optim.tzip"), o4);
  roundtrip(p("s400d/model.tzip"), m4);
  roundtrip(p("s400d/optim.tzip"), o4);
  // A synthetic third checkpoint: step400 with a few master values nudged
  // and the BF16 weights re-derived, coded against s400d (chain 600->400->200).
  const tc::SafetensorsInfo st = tc::read_safetensors_info(o4);
  Bytes optim = read_all(o4);
  for (const auto& t : st.tensors)
    if (t.name.rfind("master.", 0) == 0)
      for (uint64_t i = 0; i < t.raw_size(); i += 4 * 97) optim[st.data_start + t.data_begin + i + 1] ^= 0x10;
  write_all(p("o6.safetensors"), optim);
  const tc::SafetensorsInfo ms = tc::read_safetensors_info(m4);
  Bytes model = read_all(m4);
  for (const auto& t : ms.tensors) {
    const auto& s = st.tensors[(size_t)std::distance(
        st.tensors.begin(), std::find_if(st.tensors.begin(), st.tensors.end(),
                                         [&](const tc::TensorEntry& e) { return e.name == "master." + t.name; }))];
    tp::cast_xor(optim.data() + st.data_start + s.data_begin, model.data() + ms.data_start + t.data_begin,
                 t.raw_size() / 2, tp::kCastBF16);  // residual vs new cast ...
    Bytes zero(t.raw_size(), 0);
    // ... replaced by the exact cast: value = cast(master6).
    std::memcpy(model.data() + ms.data_start + t.data_begin, zero.data(), zero.size());
    tp::cast_xor(optim.data() + st.data_start + s.data_begin, model.data() + ms.data_start + t.data_begin,
                 t.raw_size() / 2, tp::kCastBF16);
  }
  write_all(p("m6.safetensors"), model);
  tc::compress_checkpoint({p("m6.safetensors"), p("o6.safetensors")}, {p("s600/model.tzip"), p("s600/optim.tzip")}, o,
                          {p("s400d/model.tzip"), p("s400d/optim.tzip")});
  roundtrip(p("s600/model.tzip"), p("m6.safetensors"));
  roundtrip(p("s600/optim.tzip"), p("o6.safetensors"));
  tc::Reader o6(p("s600/optim.tzip"));
  EXPECT_EQ(entry(o6, "master.tok.weight").predict.kind, tc::PredictKind::kDelta);
}

// ---- compress_checkpoint: all outputs or none --------------------------------

namespace {
std::vector<std::string> list_dir(const std::string& d) {
  std::vector<std::string> v;
  if (DIR* dp = opendir(d.c_str())) {
    while (dirent* e = readdir(dp)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") v.push_back(n);
    }
    closedir(dp);
  }
  std::sort(v.begin(), v.end());
  return v;
}
// A two-file checkpoint: FP32 master (optim) and its BF16 cast (model).
void write_ckpt(const std::string& optim, const std::string& model, size_t n, uint32_t seed) {
  const Bytes m = normal_f32(n, 0.02f, seed);
  std::string shape = std::to_string(n);  // (not "[" + ...: GCC 12 -Wrestrict false positive)
  shape.insert(0, 1, '[');
  shape.push_back(']');
  write_st(optim, {{"opt.master", "F32", shape, m}});
  write_st(model, {{"model.w", "BF16", shape, cast_of(m, tp::kCastBF16)}});
}
}  // namespace

TEST_F(Predict, CompressCheckpointFailureOfSecondInputLeavesNothing) {
  mkdir(p("in").c_str(), 0755);
  mkdir(p("out").c_str(), 0755);
  write_ckpt(p("in/optim.safetensors"), p("in/model.safetensors"), 100000, 1);
  // The model file is written second (it holds BF16 tensors): damage it so
  // that its header parses but its data is short.
  Bytes bad = read_all(p("in/model.safetensors"));
  write_all(p("in/bad.safetensors"), Bytes(bad.begin(), bad.end() - 1000));
  const std::vector<std::string> ins = {p("in/bad.safetensors"), p("in/optim.safetensors")};
  const std::vector<std::string> outs = {p("out/model.tzip"), p("out/optim.tzip")};
  tc::WriteOptions o;
  o.threads = 2;
  try {
    tc::compress_checkpoint(ins, outs, o);
    FAIL() << "a truncated input must fail";
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(list_dir(p("out")).empty());

  // The 2nd file fails only once the 1st is complete: its previous
  // checkpoint (--ref) is not a .tzip file.
  write_all(p("in/garbage.tzip"), Bytes(4096, 7));
  try {
    tc::compress_checkpoint({p("in/model.safetensors"), p("in/optim.safetensors")}, outs, o,
                            {p("in/garbage.tzip"), ""});
    FAIL() << "a bad reference for the 2nd file must fail";
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("garbage.tzip"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(list_dir(p("out")).empty());
  // A folder given as an input: refused before any work.
  mkdir(p("in/dir.safetensors").c_str(), 0755);
  EXPECT_THROW(tc::compress_checkpoint({p("in/optim.safetensors"), p("in/dir.safetensors")}, outs, o), tc::Error);
  EXPECT_TRUE(list_dir(p("out")).empty());
}

TEST_F(Predict, CompressCheckpointCancelDuringSecondFileRemovesFirstOutput) {
  mkdir(p("out").c_str(), 0755);
  write_ckpt(p("optim.safetensors"), p("model.safetensors"), 1u << 20, 2);  // 4 MiB + 2 MiB
  const std::vector<std::string> ins = {p("model.safetensors"), p("optim.safetensors")};
  const std::vector<std::string> outs = {p("out/model.tzip"), p("out/optim.tzip")};
  tc::WriteOptions o;
  o.threads = 2;
  o.chunk_bytes = 1u << 20;
  int finished = 0;
  bool cancelled = false;
  o.progress = [&](uint64_t done, uint64_t total) {
    if (done == total) ++finished;
    // The optim file goes first (no BF16 tensors); cancel once the model
    // file (2nd) has started, i.e. after the 1st finished.
    if (finished == 1 && done < total && !cancelled) {
      cancelled = true;
      tc::request_cancel();
    }
  };
  try {
    tc::compress_checkpoint(ins, outs, o);
    tc::clear_cancel();
    FAIL() << "cancel must stop the call";
  } catch (const tc::Error& e) {
    tc::clear_cancel();
    EXPECT_EQ(e.kind(), tc::ErrorKind::kInterrupted) << e.what();
  }
  EXPECT_TRUE(cancelled);
  EXPECT_TRUE(list_dir(p("out")).empty());
  // And without the cancel both appear.
  o.progress = nullptr;
  tc::compress_checkpoint(ins, outs, o);
  EXPECT_EQ(list_dir(p("out")), (std::vector<std::string>{"model.tzip", "optim.tzip"}));
}

TEST_F(Predict, CompressCheckpointExistingOutputsAndForce) {
  mkdir(p("out").c_str(), 0755);
  write_ckpt(p("optim.safetensors"), p("model.safetensors"), 50000, 3);
  const std::vector<std::string> ins = {p("model.safetensors"), p("optim.safetensors")};
  const std::vector<std::string> outs = {p("out/model.tzip"), p("out/optim.tzip")};
  write_all(p("out/model.tzip"), Bytes{'o', 'l', 'd'});
  tc::WriteOptions o;
  try {
    tc::compress_checkpoint(ins, outs, o);
    FAIL() << "an existing output must be refused";
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kExists) << e.what();
  }
  EXPECT_EQ(list_dir(p("out")), std::vector<std::string>{"model.tzip"});
  EXPECT_EQ(read_all(p("out/model.tzip")), (Bytes{'o', 'l', 'd'}));
  // With force, a failing 2nd input puts the replaced file back.
  o.force = true;
  mkdir(p("bad.safetensors").c_str(), 0755);
  EXPECT_THROW(tc::compress_checkpoint({p("optim.safetensors"), p("bad.safetensors")}, outs, o), tc::Error);
  EXPECT_EQ(list_dir(p("out")), std::vector<std::string>{"model.tzip"});
  EXPECT_EQ(read_all(p("out/model.tzip")), (Bytes{'o', 'l', 'd'}));
  tc::compress_checkpoint(ins, outs, o);
  EXPECT_EQ(list_dir(p("out")), (std::vector<std::string>{"model.tzip", "optim.tzip"}));
  roundtrip(p("out/model.tzip"), p("model.safetensors"));
  // The cast across files is recorded by the final name, not a temporary one.
  tc::Reader r(p("out/model.tzip"));
  ASSERT_EQ(r.references().size(), 1u);
  EXPECT_EQ(r.references()[0].file, "optim.tzip");
  // An output that is an input, or two inputs to one output: refused.
  EXPECT_THROW(tc::compress_checkpoint(ins, {p("out/x.tzip"), p("out/x.tzip")}, o), tc::Error);
  EXPECT_THROW(tc::compress_checkpoint(ins, {p("model.safetensors"), p("out/y.tzip")}, o), tc::Error);
  EXPECT_EQ(list_dir(p("out")), (std::vector<std::string>{"model.tzip", "optim.tzip"}));
}

TEST_F(Predict, CompressCheckpointDiskFullLeavesNothing) {
  // A file size limit makes writes fail with EFBIG, as a full disk does
  // with ENOSPC: the 1st output fits, the 2nd does not.
  mkdir(p("out").c_str(), 0755);
  write_st(p("small.safetensors"), {{"a", "F32", "[1000]", normal_f32(1000, 1.f, 4)}});
  std::mt19937 g(5);
  Bytes noise(8u << 20);
  for (auto& b : noise) b = (uint8_t)g();
  write_st(p("big.safetensors"), {{"b", "U8", "[" + std::to_string(noise.size()) + "]", noise}});
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 4u << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  tc::WriteOptions o;
  o.level = -1;
  bool threw = false;
  std::string msg;
  try {
    tc::compress_checkpoint({p("small.safetensors"), p("big.safetensors")}, {p("out/small.tzip"), p("out/big.tzip")}, o);
  } catch (const tc::Error& e) {
    threw = true;
    msg = e.what();
    EXPECT_EQ(e.kind(), tc::ErrorKind::kIO) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_NE(msg.find("big.tzip"), std::string::npos) << msg;
  EXPECT_TRUE(list_dir(p("out")).empty());
}

// ---- fast delta path and reference chains ------------------------------------

TEST_F(Predict, RefOriginalGivesTheSameFileAndIsChecked) {
  const size_t n = 300000;
  Bytes m1 = normal_f32(n, 0.02f, 6);
  Bytes m2 = m1;
  std::mt19937 g(7);
  std::normal_distribution<float> d(0.f, 1e-4f);
  for (size_t i = 0; i < n; ++i) {
    const float v = u2f(f2u(*(float*)&m1[4 * i]));
    const float w = v + d(g) * std::fabs(v);
    std::memcpy(&m2[4 * i], &w, 4);
  }
  write_st(p("s1.safetensors"), {{"m", "F32", "[300000]", m1}, {"small", "F32", "[1000]", Bytes(m1.begin(), m1.begin() + 4000)}});
  write_st(p("s2.safetensors"), {{"m", "F32", "[300000]", m2}, {"small", "F32", "[1000]", Bytes(m2.begin(), m2.begin() + 4000)}});
  tc::WriteOptions o;
  o.chunk_bytes = 1u << 20;
  tc::compress_file(p("s1.safetensors"), p("s1.tzip"), o);
  o.ref = p("s1.tzip");
  tc::compress_file(p("s2.safetensors"), p("slow.tzip"), o);
  o.ref_original = p("s1.safetensors");
  tc::compress_file(p("s2.safetensors"), p("fast.tzip"), o);
  EXPECT_EQ(read_all(p("slow.tzip")), read_all(p("fast.tzip")));
  tc::Reader r(p("fast.tzip"));
  EXPECT_EQ(entry(r, "m").predict.kind, tc::PredictKind::kDelta);
  roundtrip(p("fast.tzip"), p("s2.safetensors"));
  // Reader::check_bytes: by block checksums (s1, stored as itself) and by
  // decoding (fast.tzip's 'm' is a delta), on an unaligned range.
  {
    for (const char* name : {"s1", "fast"}) {
      tc::Reader r(p(std::string(name) + ".tzip"));
      const Bytes st = read_all(p(std::string(name == std::string("s1") ? "s1" : "s2") + ".safetensors"));
      const uint64_t base = tc::read_safetensors_info(p("s1.safetensors")).data_start + entry(r, "m").data_begin;
      Bytes mine(st.begin() + base, st.begin() + base + 4 * n);
      auto from = [&](const Bytes& b) {
        return [&b](uint64_t o, uint64_t len, uint8_t* dst) { std::memcpy(dst, b.data() + o, len); };
      };
      const size_t mi = (size_t)r.find("m");
      EXPECT_TRUE(r.check_bytes(mi, 1000, 700000, from(mine))) << name;
      mine[900000] ^= 1;
      EXPECT_TRUE(r.check_bytes(mi, 1000, 700000, from(mine))) << name;  // outside the covering blocks
      EXPECT_FALSE(r.check_bytes(mi, 0, 4 * n, from(mine))) << name;
    }
  }
  // Read side: the reference's content given as its safetensors file.
  tc::ReadOptions ro;
  ro.refs = {p("s1.tzip")};
  ro.ref_originals = {p("s1.safetensors")};
  roundtrip(p("fast.tzip"), p("s2.safetensors"), ro);
  ro.ref_originals = {p("s1.tzip")};  // not a safetensors file of that header and size
  EXPECT_THROW(roundtrip(p("fast.tzip"), p("s2.safetensors"), ro), tc::Error);
  ro.ref_originals = {};
  ro.refs.clear();
  ro.ref_originals = {p("s1.safetensors")};  // without its --ref
  EXPECT_THROW(roundtrip(p("fast.tzip"), p("s2.safetensors"), ro), tc::Error);
  // A wrong original of the same layout (one byte of 'm' changed, in its
  // first block, away from the discovery sample): caught by the block
  // checksums on both sides.
  {
    tc::Reader r1(p("s1.tzip"));
    const tc::TensorEntry& e = entry(r1, "m");
    ASSERT_GT(e.n_blocks(), 2u);
    const uint64_t at = tc::read_safetensors_info(p("s1.safetensors")).data_start + e.data_begin + 10;
    Bytes bad = read_all(p("s1.safetensors"));
    bad[at] ^= 0x40;
    write_all(p("bad1.safetensors"), bad);
  }
  tc::WriteOptions ob;
  ob.chunk_bytes = 1u << 20;
  ob.ref = p("s1.tzip");
  ob.ref_original = p("bad1.safetensors");
  try {
    tc::compress_file(p("s2.safetensors"), p("y.tzip"), ob);
    FAIL() << "a wrong ref_original must be refused";
  } catch (const tc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("differs from"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(exists(p("y.tzip")));
  ro.refs = {p("s1.tzip")};
  ro.ref_originals = {p("bad1.safetensors")};
  EXPECT_THROW(roundtrip(p("fast.tzip"), p("s2.safetensors"), ro), tc::Error);
  // Another safetensors file as ref_original: refused (header/size check).
  o.ref_original = p("s2.safetensors");
  write_st(p("other.safetensors"), {{"m", "F32", "[3]", normal_f32(3, 1.f, 1)}});
  o.ref_original = p("other.safetensors");
  EXPECT_THROW(tc::compress_file(p("s2.safetensors"), p("x.tzip"), o), tc::Error);
  o.ref.clear();
  EXPECT_THROW(tc::compress_file(p("s2.safetensors"), p("x.tzip"), o), tc::Error);
  EXPECT_FALSE(exists(p("x.tzip")));
}

TEST_F(Predict, ReferencePathsForAWholeChain) {
  const size_t n = 200000;
  Bytes m = normal_f32(n, 0.02f, 8);
  std::vector<std::string> st;
  for (int k = 0; k < 3; ++k) {
    st.push_back(p("c" + std::to_string(k) + ".safetensors"));
    write_st(st.back(), {{"m", "F32", "[200000]", m}});
    for (size_t i = 0; i < n; i += 3) m[4 * i] ^= 1;  // small change in the lowest mantissa byte
  }
  tc::WriteOptions o;
  tc::compress_file(st[0], p("c0.tzip"), o);
  o.ref = p("c0.tzip");
  tc::compress_file(st[1], p("c1.tzip"), o);
  o.ref = p("c1.tzip");
  tc::compress_file(st[2], p("c2.tzip"), o);
  ASSERT_EQ(entry(tc::Reader(p("c2.tzip")), "m").predict.kind, tc::PredictKind::kDelta);
  mkdir(p("a").c_str(), 0755);
  mkdir(p("b").c_str(), 0755);
  ASSERT_EQ(rename(p("c0.tzip").c_str(), p("a/zero.tzip").c_str()), 0);
  ASSERT_EQ(rename(p("c1.tzip").c_str(), p("b/one.tzip").c_str()), 0);
  {
    tc::Reader r(p("c2.tzip"));
    r.add_reference_paths({p("a/zero.tzip"), p("b/one.tzip")});  // any order, the deeper one passed on
    r.check_references();
    const Bytes all = read_all(st[2]);
    EXPECT_EQ(r.read_tensor("m"), Bytes(all.end() - 4 * n, all.end()));
  }
  tc::ReadOptions ro;
  ro.refs = {p("b/one.tzip"), p("a/zero.tzip")};
  roundtrip(p("c2.tzip"), st[2], ro);
  {
    tc::Reader r(p("c2.tzip"));
    r.add_reference_paths({p("b/one.tzip")});
    EXPECT_THROW(r.check_references(), tc::Error);  // zero.tzip is missing at its recorded path
  }
  {
    tc::WriteOptions plain;
    plain.predict = false;
    tc::compress_file(st[1], p("unrelated.tzip"), plain);
    tc::Reader r(p("c2.tzip"));
    r.add_reference_paths({p("b/one.tzip"), p("a/zero.tzip"), p("unrelated.tzip")});
    try {
      r.check_references();
      FAIL() << "a path in no reference chain must be refused";
    } catch (const tc::Error& e) {
      EXPECT_NE(std::string(e.what()).find("unrelated.tzip is not a reference of this file"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(Predict, FolderWithRefOriginalFolderGivesTheSameFiles) {
  mkdir(p("s1").c_str(), 0755);
  mkdir(p("s2").c_str(), 0755);
  const size_t n = 200000;
  Bytes m1 = normal_f32(n, 0.02f, 21), m2 = m1;
  for (size_t i = 0; i < n; i += 2) m2[4 * i] ^= 3;
  write_st(p("s1/optim.safetensors"), {{"master", "F32", "[200000]", m1}});
  write_st(p("s1/model.safetensors"), {{"w", "BF16", "[200000]", cast_of(m1, tp::kCastBF16)}});
  write_st(p("s2/optim.safetensors"), {{"master", "F32", "[200000]", m2}});
  write_st(p("s2/model.safetensors"), {{"w", "BF16", "[200000]", cast_of(m2, tp::kCastBF16)}});
  tc::WriteOptions o;
  tc::compress_folder(p("s1"), p("s1.tzip"), o);
  o.ref = p("s1.tzip");
  tc::compress_folder(p("s2"), p("a.tzip"), o);
  o.ref_original = p("s1");
  tc::compress_folder(p("s2"), p("b.tzip"), o);
  EXPECT_EQ(read_all(p("a.tzip/optim.tzip")), read_all(p("b.tzip/optim.tzip")));
  EXPECT_EQ(read_all(p("a.tzip/model.tzip")), read_all(p("b.tzip/model.tzip")));
  EXPECT_EQ(entry(tc::Reader(p("b.tzip/optim.tzip")), "master").predict.kind, tc::PredictKind::kDelta);
  tc::decompress_folder(p("b.tzip"), p("back"), tc::ReadOptions{});
  EXPECT_EQ(read_all(p("back/optim.safetensors")), read_all(p("s2/optim.safetensors")));
  // A file as the reference's original of a folder: refused.
  o.ref_original = p("s1/optim.safetensors");
  EXPECT_THROW(tc::compress_folder(p("s2"), p("c.tzip"), o), tc::Error);
  EXPECT_FALSE(exists(p("c.tzip")));
}

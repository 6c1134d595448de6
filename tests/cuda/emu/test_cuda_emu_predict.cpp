// Predicted tensors (doc/cuda.md, "Predicted tensors") under the CPU
// emulation of the CUDA backend: the fused cast and delta predictions code
// the CPU frame of the residual, decode back to the values with the
// prediction and to the residual without it, and bad prediction parameters
// are per-item errors.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/predict.h"
#include "cuda_emu_batch.h"

namespace {

using namespace tz_cuda_emu_test;

// Residual of `values` against a prediction, with the CPU container's
// element-wise functions (src/codec/predict.h).
Bytes residual_of(const Bytes& values, const Bytes& pred, int kind, tz_dtype dt) {
  Bytes r = values;
  if (kind == TZ_CUDA_PREDICT_CAST)
    tz::predict::cast_xor(pred.data(), r.data(), r.size() / 2,
                          dt == TZ_DTYPE_F16 ? tz::predict::kCastF16 : tz::predict::kCastBF16);
  else
    tz::predict::xor_bytes(pred.data(), r.data(), r.size());
  return r;
}

struct PredCase {
  tz_dtype dt;
  int kind;
  Bytes values, pred;
};

// FP32 masters and their cast, with every 97th element changed (an inexact
// prediction: the exceptions cost their own bits only).
PredCase cast_case(tz_dtype dt, size_t n, uint32_t seed) {
  Bytes m = make_tensor(TZ_DTYPE_F32, n, seed);
  Bytes v(n * 2);
  for (size_t i = 0; i < n; ++i) {
    uint16_t c = tz::predict::cast_f32(tz::load_le32(&m[4 * i]),
                                       dt == TZ_DTYPE_F16 ? tz::predict::kCastF16 : tz::predict::kCastBF16);
    if (i % 97 == 5) c ^= (uint16_t)(0x0101u * (1 + i % 7));
    tz::store_le16(&v[2 * i], c);
  }
  return {dt, TZ_CUDA_PREDICT_CAST, v, m};
}

// The previous tensor and a nudged copy (low mantissa bits change).
PredCase delta_case(tz_dtype dt, size_t n, uint32_t seed) {
  Bytes prev = make_tensor(dt, n, seed);
  Bytes cur = prev;
  std::mt19937 rng(seed);
  const size_t es = prev.size() / n;
  for (size_t i = 0; i < n; ++i)
    if (rng() % 3 == 0) cur[i * es] ^= (uint8_t)(1 + rng() % 3);
  return {dt, TZ_CUDA_PREDICT_DELTA, cur, prev};
}

void predicted_roundtrip(const std::vector<PredCase>& cases, const tz_params& p) {
  const size_t n = cases.size();
  std::vector<std::unique_ptr<Buf>> src, pred, dst, back, raw;
  std::vector<tz_cuda_compress_item> items;
  for (const auto& c : cases) {
    src.push_back(std::make_unique<Buf>(c.values.size()));
    src.back()->put(c.values);
    pred.push_back(std::make_unique<Buf>(c.pred.size()));
    pred.back()->put(c.pred);
    const size_t cap = tz_compress_bound(c.values.size());
    dst.push_back(std::make_unique<Buf>(cap));
    tz_cuda_compress_item it{src.back()->p(), c.values.size(), c.dt, dst.back()->p(), cap, {}};
    it.predict = {c.kind, pred.back()->p(), c.pred.size()};
    items.push_back(it);
  }
  const Result r = emu_compress(items, p);
  std::vector<tz_cuda_decompress_item> d, dr;
  for (size_t i = 0; i < n; ++i) {
    const PredCase& c = cases[i];
    SCOPED_TRACE("item " + std::to_string(i) + " dtype " + std::to_string(c.dt) + " kind " + std::to_string(c.kind));
    ASSERT_EQ(r.status[i], TZ_OK);
    ASSERT_TRUE(src[i]->guards_intact() && pred[i]->guards_intact() && dst[i]->guards_intact());
    ASSERT_TRUE(src[i]->get(c.values.size()) == c.values) << "input modified";
    // The frame is the CPU frame of the residual.
    tz_params cp = p;
    cp.dtype = c.dt;
    const Bytes resid = residual_of(c.values, c.pred, c.kind, c.dt);
    const Bytes cpu = cpu_compress(resid, cp);
    ASSERT_TRUE(dst[i]->get(r.size[i]) == cpu) << "frame differs from the CPU frame of the residual";
    back.push_back(std::make_unique<Buf>(c.values.size()));
    tz_cuda_decompress_item di{dst[i]->p(), r.size[i], back.back()->p(), c.values.size(), {}};
    di.predict = {c.kind, pred[i]->p(), c.pred.size()};
    d.push_back(di);
    raw.push_back(std::make_unique<Buf>(c.values.size()));
    dr.push_back({dst[i]->p(), r.size[i], raw.back()->p(), c.values.size(), {}});
  }
  const Result rd = emu_decompress(d);
  const Result rr = emu_decompress(dr);
  for (size_t i = 0; i < n; ++i) {
    const PredCase& c = cases[i];
    SCOPED_TRACE("item " + std::to_string(i));
    ASSERT_EQ(rd.status[i], TZ_OK);
    ASSERT_EQ(rd.size[i], c.values.size());
    ASSERT_TRUE(back[i]->get(c.values.size()) == c.values) << "value = residual XOR prediction";
    ASSERT_TRUE(back[i]->guards_intact());
    ASSERT_EQ(rr.status[i], TZ_OK);  // without the prediction: the residual itself
    ASSERT_TRUE(raw[i]->get(c.values.size()) == residual_of(c.values, c.pred, c.kind, c.dt));
  }
}

TEST(CudaEmu, PredictedCastAndDeltaMatchCpuResiduals) {
  tz_params p{};
  p.block_elems = 4096;
  predicted_roundtrip({cast_case(TZ_DTYPE_BF16, 10000, 1), cast_case(TZ_DTYPE_F16, 9000, 2),
                       delta_case(TZ_DTYPE_F32, 9001, 3), delta_case(TZ_DTYPE_BF16, 5000, 4),
                       delta_case(TZ_DTYPE_F8_E4M3, 8200, 5)},
                      p);
  // Exact cast: an all-zero residual.
  PredCase exact = cast_case(TZ_DTYPE_BF16, 4500, 6);
  for (size_t i = 0; i < 4500; ++i)
    tz::store_le16(&exact.values[2 * i], tz::predict::cast_f32(tz::load_le32(&exact.pred[4 * i]), tz::predict::kCastBF16));
  p.level = 2;
  predicted_roundtrip({exact, delta_case(TZ_DTYPE_F16, 4096, 7)}, p);
}

TEST(CudaEmu, PredictionParameterErrors) {
  tz_params p{};
  p.block_elems = 4096;
  const Bytes f32 = make_tensor(TZ_DTYPE_F32, 5000, 8);
  const Bytes bf = make_tensor(TZ_DTYPE_BF16, 5000, 9);
  Buf s32(f32.size()), sbf(bf.size()), pr(f32.size());
  s32.put(f32);
  sbf.put(bf);
  pr.put(f32);
  const size_t cap = tz_compress_bound(f32.size());
  Buf o1(cap), o2(cap), o3(cap), o4(cap);
  std::vector<tz_cuda_compress_item> items = {
      {s32.p(), f32.size(), TZ_DTYPE_F32, o1.p(), cap, {TZ_CUDA_PREDICT_CAST, pr.p(), f32.size()}},  // cast to F32
      {sbf.p(), bf.size(), TZ_DTYPE_BF16, o2.p(), cap, {TZ_CUDA_PREDICT_CAST, pr.p(), bf.size()}},   // source too small
      {sbf.p(), bf.size(), TZ_DTYPE_BF16, o3.p(), cap, {7, pr.p(), f32.size()}},                     // unknown kind
      {sbf.p(), bf.size(), TZ_DTYPE_BF16, o4.p(), cap, {TZ_CUDA_PREDICT_CAST, pr.p(), f32.size()}},  // fine
  };
  const Result r = emu_compress(items, p);
  EXPECT_EQ(r.status[0], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(r.status[1], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(r.status[2], TZ_ERROR_BAD_PARAMETER);
  ASSERT_EQ(r.status[3], TZ_OK);
  // Decoding: a cast needs a BF16/F16 frame and a large enough source.
  tz_params cp = p;
  cp.dtype = TZ_DTYPE_F32;
  const Bytes frame32 = cpu_compress(f32, cp);
  Buf fin(frame32.size()), out1(f32.size()), out2(bf.size()), out3(bf.size());
  fin.put(frame32);
  std::vector<tz_cuda_decompress_item> d = {
      {fin.p(), frame32.size(), out1.p(), f32.size(), {TZ_CUDA_PREDICT_CAST, pr.p(), f32.size() * 2}},
      {o4.p(), r.size[3], out2.p(), bf.size(), {TZ_CUDA_PREDICT_CAST, pr.p(), bf.size()}},
      {o4.p(), r.size[3], out3.p(), bf.size(), {TZ_CUDA_PREDICT_DELTA, pr.p(), bf.size() - 1}},
  };
  const Result rd = emu_decompress(d);
  EXPECT_EQ(rd.status[0], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(rd.status[1], TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(rd.status[2], TZ_ERROR_BAD_PARAMETER);
  EXPECT_TRUE(out1.guards_intact() && out2.guards_intact() && out3.guards_intact());
}

}  // namespace

// GPU tests of the CUDA backend. Each test skips when no CUDA device is
// present (CI, build machines). On a GPU they check: round trips of every
// float dtype at random sizes and levels, byte-identical frames against the
// CPU encoder, CPU<->GPU interop both ways, special values, mixed batches
// with unsupported items, corrupted frames (per-item status, no write
// outside dst), and the real fixture slices.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/predict.h"
#include "tensorzip/tensorzip.h"
#include "tensorzip/tensorzip_cuda.h"
#include "cuda_test_common.h"
#include "tz_malformed_frames.h"
#include "tz_test_data.h"

namespace {

using namespace tz_cuda_test;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

// Device buffer with canary bytes on both sides, to catch writes outside.
struct DevBuf {
  static constexpr size_t kGuard = 4096;
  uint8_t* base = nullptr;
  size_t size = 0;
  explicit DevBuf(size_t n) : size(n) {
    EXPECT_EQ(cudaMalloc(&base, n + 2 * kGuard), cudaSuccess);
    EXPECT_EQ(cudaMemset(base, 0xA5, n + 2 * kGuard), cudaSuccess);
  }
  ~DevBuf() { cudaFree(base); }
  DevBuf(const DevBuf&) = delete;
  uint8_t* p() const { return base + kGuard; }
  Bytes get(size_t n) const {
    Bytes h(n);
    if (n) EXPECT_EQ(cudaMemcpy(h.data(), p(), n, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void put(const Bytes& h) const {
    if (!h.empty()) EXPECT_EQ(cudaMemcpy(p(), h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  bool guards_intact() const {
    Bytes g(kGuard);
    for (uint8_t* at : {base, base + kGuard + size}) {
      if (cudaMemcpy(g.data(), at, kGuard, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
      for (uint8_t b : g)
        if (b != 0xA5) return false;
    }
    return true;
  }
};

// Runs one batch call with fresh temp memory of temp_bytes and returns the
// per-item results: launch(temp, d_sizes, d_status) makes the tz_cuda_* call
// with the device arrays of per-item sizes and status codes.
template <class Launch>
Result run_gpu_batch(size_t n, size_t temp_bytes, Launch&& launch) {
  void* temp = nullptr;
  size_t* d_sizes = nullptr;
  int* d_status = nullptr;
  EXPECT_EQ(cudaMalloc(&temp, temp_bytes + 256), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_sizes, n * sizeof(size_t) + 8), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_status, n * sizeof(int) + 8), cudaSuccess);
  const size_t r = launch(temp, d_sizes, d_status);
  EXPECT_EQ(r, 0u) << tz_get_error_name(r);
  Result res{std::vector<size_t>(n), std::vector<int>(n)};
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(res.size.data(), d_sizes, n * sizeof(size_t), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(res.status.data(), d_status, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(temp);
  cudaFree(d_sizes);
  cudaFree(d_status);
  return res;
}

Result gpu_compress(const std::vector<tz_cuda_compress_item>& items, const tz_params& p) {
  const size_t n = items.size();
  const size_t tb = tz_cuda_compress_temp_size(items.data(), n, &p);
  EXPECT_FALSE(tz_is_error(tb));
  return run_gpu_batch(n, tb, [&](void* temp, size_t* d_sizes, int* d_status) {
    return tz_cuda_compress(items.data(), n, &p, temp, tb, d_sizes, d_status, 0);
  });
}

Result gpu_decompress(const std::vector<tz_cuda_decompress_item>& items) {
  const size_t n = items.size();
  const size_t tb = tz_cuda_decompress_temp_size(items.data(), n);
  EXPECT_FALSE(tz_is_error(tb));
  return run_gpu_batch(n, tb, [&](void* temp, size_t* d_sizes, int* d_status) {
    return tz_cuda_decompress(items.data(), n, temp, tb, d_sizes, d_status, 0);
  });
}

uint32_t elem_size(tz_dtype dt) {
  switch (dt) {
    case TZ_DTYPE_BF16: case TZ_DTYPE_F16: return 2;
    case TZ_DTYPE_F32: return 4;
    default: return 1;
  }
}

// Compresses every tensor on the GPU in one batch; checks frames equal the
// CPU's, then decodes them on the GPU (and the CPU frames too) and on the
// CPU.
void roundtrip_batch(const std::vector<std::pair<tz_dtype, Bytes>>& tensors, const tz_params& p) {
  const size_t n = tensors.size();
  std::vector<std::unique_ptr<DevBuf>> src, dst, back, cpu_frames, back2;
  std::vector<tz_cuda_compress_item> items;
  for (auto& [dt, data] : tensors) {
    src.push_back(std::make_unique<DevBuf>(data.size()));
    src.back()->put(data);
    const size_t cap = tz_compress_bound(data.size());
    dst.push_back(std::make_unique<DevBuf>(cap));
    items.push_back({src.back()->p(), data.size(), dt, dst.back()->p(), cap});
  }
  tz_params pp = p;
  const Result c = gpu_compress(items, pp);
  std::vector<tz_cuda_decompress_item> ditems, ditems_cpu;
  std::vector<Bytes> cpu(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& [dt, data] = tensors[i];
    ASSERT_EQ(c.status[i], TZ_OK) << "item " << i;
    ASSERT_TRUE(dst[i]->guards_intact()) << "item " << i;
    tz_params cp = p;
    cp.dtype = dt;
    cpu[i] = cpu_compress(data, cp);
    const Bytes g = dst[i]->get(c.size[i]);
    ASSERT_EQ(g.size(), cpu[i].size()) << "item " << i << " dtype " << dt << " n " << data.size();
    ASSERT_TRUE(g == cpu[i]) << "GPU frame differs from CPU frame, item " << i;
    // CPU decodes the GPU frame.
    Bytes dec(data.size() + 1);
    ASSERT_EQ(tz_decompress(dec.data(), dec.size(), g.data(), g.size(), 1), data.size());
    dec.resize(data.size());
    ASSERT_TRUE(dec == data);
    back.push_back(std::make_unique<DevBuf>(data.size()));
    ditems.push_back({dst[i]->p(), c.size[i], back.back()->p(), data.size()});
    cpu_frames.push_back(std::make_unique<DevBuf>(cpu[i].size()));
    cpu_frames.back()->put(cpu[i]);
    back2.push_back(std::make_unique<DevBuf>(data.size()));
    ditems_cpu.push_back({cpu_frames.back()->p(), cpu[i].size(), back2.back()->p(), data.size()});
  }
  const Result d = gpu_decompress(ditems);
  const Result d2 = gpu_decompress(ditems_cpu);
  for (size_t i = 0; i < n; ++i) {
    const Bytes& data = tensors[i].second;
    ASSERT_EQ(d.status[i], TZ_OK) << "item " << i;
    ASSERT_EQ(d.size[i], data.size());
    ASSERT_TRUE(back[i]->get(data.size()) == data) << "item " << i;
    ASSERT_TRUE(back[i]->guards_intact());
    ASSERT_EQ(d2.status[i], TZ_OK) << "item " << i;
    ASSERT_TRUE(back2[i]->get(data.size()) == data) << "item " << i;
  }
}

TEST(CudaGpu, RandomSizesEveryDtype) {
  REQUIRE_GPU();
  std::mt19937 rng(42);
  for (int level : {-1, 1, 2}) {  // level 3 (lane contexts) is CPU-encoded only: LaneContextFrames
    for (unsigned be : {0u, 4096u, 16384u}) {
      std::vector<std::pair<tz_dtype, Bytes>> batch;
      for (tz_dtype dt : kFloatTypes) {
        for (size_t n : {(size_t)0, (size_t)1, (size_t)31, (size_t)129, (size_t)4096, (size_t)65537,
                         (size_t)(rng() % 300000)})
          batch.push_back({dt, make_tensor(dt, n, rng())});
      }
      tz_params p{};
      p.level = level;
      p.block_elems = be;
      SCOPED_TRACE("level " + std::to_string(level) + " block_elems " + std::to_string(be));
      roundtrip_batch(batch, p);
    }
  }
}

TEST(CudaGpu, SpecialValues) {
  REQUIRE_GPU();
  std::vector<std::pair<tz_dtype, Bytes>> batch;
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -1e-45f, 3.4e38f, 1.0f};
  for (tz_dtype dt : kFloatTypes) {
    std::vector<float> v(70000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = specials[(i * 7 + i / 3) % 10];
    const Bytes b = float_bytes(dt, v);
    batch.push_back({dt, b});
    batch.push_back({dt, Bytes(b.size(), 0)});                         // all zero: one symbol per stream
    batch.push_back({dt, tzt::hash_stream(b.size(), (uint64_t)dt)});  // incompressible: raw blocks
  }
  roundtrip_batch(batch, tz_params{});
}

// Level-3 CPU frames (lane contexts, format version 2) decode on the GPU;
// the GPU encoder refuses level 3.
TEST(CudaGpu, LaneContextFrames) {
  REQUIRE_GPU();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(300000);
  float scale = 1.0f;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % 256 == 0) scale = std::ldexp(1.0f, -(int)(rng() % 24));
    const float g = nd(rng);
    v[i] = g * g * scale;
  }
  for (tz_dtype dt : {TZ_DTYPE_F32, TZ_DTYPE_BF16}) {
    Bytes b = dt == TZ_DTYPE_BF16 ? tzt::to_bf16(v) : Bytes(v.size() * 4);
    if (dt == TZ_DTYPE_F32) memcpy(b.data(), v.data(), b.size());
    tz_params p{};
    p.dtype = dt;
    p.level = 3;
    Bytes f(tz_compress_bound(b.size()));
    const size_t fs = tz_compress(f.data(), f.size(), b.data(), b.size(), &p);
    ASSERT_FALSE(tz_is_error(fs));
    f.resize(fs);
    ASSERT_EQ(f[4], 2) << "expected a lane-context frame";
    DevBuf src(f.size()), dst(b.size());
    src.put(f);
    ASSERT_EQ(tz_cuda_decompress_tensor(dst.p(), b.size(), src.p(), f.size(), nullptr), b.size());
    EXPECT_TRUE(dst.get(b.size()) == b);
    EXPECT_TRUE(dst.guards_intact());
    DevBuf out(f.size());
    EXPECT_EQ(tz_get_error_code(tz_cuda_compress_tensor(out.p(), f.size(), dst.p(), b.size(), &p, nullptr)),
              TZ_ERROR_UNSUPPORTED);
  }
}

TEST(CudaGpu, UnsupportedItemsInBatch) {
  REQUIRE_GPU();
  const Bytes good = make_tensor(TZ_DTYPE_BF16, 10000, 3);
  DevBuf s(good.size()), d1(tz_compress_bound(good.size())), d2(tz_compress_bound(good.size())),
      d3(tz_compress_bound(good.size()));
  s.put(good);
  std::vector<tz_cuda_compress_item> items = {
      {s.p(), good.size(), TZ_DTYPE_BYTES, d1.p(), tz_compress_bound(good.size())},    // zstd path: not on GPU
      {s.p(), good.size() - 1, TZ_DTYPE_BF16, d2.p(), tz_compress_bound(good.size())},  // odd size
      {s.p(), good.size(), TZ_DTYPE_BF16, d3.p(), 100},                                 // dst too small
      {s.p(), good.size(), TZ_DTYPE_BF16, d3.p(), tz_compress_bound(good.size())},
  };
  const Result r = gpu_compress(items, tz_params{});
  EXPECT_EQ(r.status[0], TZ_ERROR_UNSUPPORTED);
  EXPECT_EQ(r.status[1], TZ_ERROR_UNSUPPORTED);
  EXPECT_EQ(r.status[2], TZ_ERROR_DST_TOO_SMALL);
  EXPECT_EQ(r.status[3], TZ_OK);
  EXPECT_EQ(r.size[0], 0u);
  EXPECT_TRUE(d3.guards_intact());
  // A CPU frame of TZ_DTYPE_BYTES with raw streams decodes on the GPU; with
  // zstd streams it is reported unsupported.
  tz_params p{};
  p.dtype = TZ_DTYPE_BYTES;
  p.level = -1;
  const Bytes raw_frame = cpu_compress(good, p);
  p.level = 1;
  const Bytes z_frame = cpu_compress(good, p);
  DevBuf f1(raw_frame.size()), f2(z_frame.size()), o1(good.size()), o2(good.size());
  f1.put(raw_frame);
  f2.put(z_frame);
  const Result d = gpu_decompress({{f1.p(), raw_frame.size(), o1.p(), good.size()},
                                   {f2.p(), z_frame.size(), o2.p(), good.size()}});
  EXPECT_EQ(d.status[0], TZ_OK);
  EXPECT_TRUE(o1.get(good.size()) == good);
  EXPECT_EQ(d.status[1], TZ_ERROR_UNSUPPORTED);
}

// Random corruption of valid frames: every corrupt item reports an error
// (the CPU decoder agrees that it is corrupt), nothing is written outside
// dst, and the intact items of the same batch still decode.
TEST(CudaGpu, CorruptFramesPerItemStatus) {
  REQUIRE_GPU();
  std::mt19937 rng(5);
  const Bytes data = make_tensor(TZ_DTYPE_BF16, 3 * 4096 + 77, 9);
  tz_params p{};
  p.dtype = TZ_DTYPE_BF16;
  p.block_elems = 4096;
  const Bytes frame = cpu_compress(data, p);
  const int kItems = 200;
  std::vector<Bytes> frames(kItems, frame);
  std::vector<std::unique_ptr<DevBuf>> fs, outs;
  std::vector<tz_cuda_decompress_item> items;
  std::vector<bool> cpu_ok(kItems);
  for (int i = 0; i < kItems; ++i) {
    Bytes& f = frames[i];
    if (i % 10 != 0) {  // every 10th stays intact
      switch (i % 4) {
        case 0: f[rng() % f.size()] ^= (uint8_t)(1u << (rng() % 8)); break;
        case 1: f.resize(rng() % f.size()); break;
        case 2: f[rng() % 64] = (uint8_t)rng(); break;  // header / tables
        case 3: for (int j = 0; j < 8; ++j) f[rng() % f.size()] = (uint8_t)rng(); break;
      }
    }
    Bytes tmp(data.size());
    cpu_ok[i] = !tz_is_error(tz_decompress(tmp.data(), tmp.size(), f.data(), f.size(), 1));
    fs.push_back(std::make_unique<DevBuf>(f.size()));
    fs.back()->put(f);
    outs.push_back(std::make_unique<DevBuf>(data.size()));
    items.push_back({fs.back()->p(), f.size(), outs.back()->p(), data.size()});
  }
  const Result r = gpu_decompress(items);
  for (int i = 0; i < kItems; ++i) {
    EXPECT_EQ(r.status[i] == TZ_OK, cpu_ok[i]) << "item " << i << " status " << r.status[i];
    EXPECT_TRUE(outs[i]->guards_intact()) << "item " << i;
    if (r.status[i] == TZ_OK) EXPECT_TRUE(outs[i]->get(data.size()) == data) << "item " << i;
    if (i % 10 == 0) EXPECT_EQ(r.status[i], TZ_OK);
  }
  // Too small a destination is an item error, not an overrun.
  DevBuf f(frame.size()), o(100);
  f.put(frame);
  const Result s = gpu_decompress({{f.p(), frame.size(), o.p(), 100}});
  EXPECT_EQ(s.status[0], TZ_ERROR_DST_TOO_SMALL);
  EXPECT_TRUE(o.guards_intact());
}

TEST(CudaGpu, FixtureSlices) {
  REQUIRE_GPU();
  std::vector<std::pair<tz_dtype, Bytes>> batch;
  for (const auto* slice : {&tzt::bf16_slice(), &tzt::fp32_slice()})
    for (const auto& t : *slice)
      batch.push_back({t.dtype == "BF16" ? TZ_DTYPE_BF16 : TZ_DTYPE_F32, t.data});
  ASSERT_FALSE(batch.empty());
  roundtrip_batch(batch, tz_params{});
  tz_params p{};
  p.level = 2;
  roundtrip_batch(batch, p);
}

// Raw runs (codec/policy_raw_runs.h): an FP32 tensor with some blocks at FP16
// precision, its streams 2 and 3 coded in those blocks alone, at the default
// block size (one block of 40 and three of 24) and at levels 1 and 2.
TEST(CudaGpu, RawRunsFp16Blocks) {
  REQUIRE_GPU();
  const std::vector<std::pair<tz_dtype, Bytes>> batch = {{TZ_DTYPE_F32, tzt::f32_with_fp16_blocks(65536, 40, 17, 18)},
                                                         {TZ_DTYPE_F32, tzt::f32_with_fp16_blocks(65536, 24, 0, 3)}};
  for (int level : {1, 2}) {
    tz_params p{};
    p.level = level;
    roundtrip_batch(batch, p);
  }
}

// Zero elision (doc/format.md 5.10) at full block size: FP32 with zero rows
// (a fifth: every stream coded and elided; one in 32: the seed stream
// elided behind its head), BF16 pruned 2:4. GPU frames equal the CPU's.
TEST(CudaGpu, ZeroElision) {
  REQUIRE_GPU();
  const std::vector<std::pair<tz_dtype, Bytes>> batch = {{TZ_DTYPE_F32, tzt::f32_with_zero_rows(12 * 65536, 256, 5)},
                                                         {TZ_DTYPE_F32, tzt::f32_with_zero_rows(9 * 65536, 256, 32)},
                                                         {TZ_DTYPE_BF16, tzt::bf16_pruned_2of4(7 * 65536 + 999)}};
  for (int level : {1, 2}) {
    tz_params p{};
    p.level = level;
    roundtrip_batch(batch, p);
  }
}

TEST(CudaGpu, ConvenienceCalls) {
  REQUIRE_GPU();
  const Bytes data = make_tensor(TZ_DTYPE_F32, 123457, 77);
  DevBuf s(data.size()), f(tz_compress_bound(data.size())), o(data.size());
  s.put(data);
  tz_params p{};
  p.dtype = TZ_DTYPE_F32;
  const size_t fs = tz_cuda_compress_tensor(f.p(), tz_compress_bound(data.size()), s.p(), data.size(), &p, 0);
  ASSERT_FALSE(tz_is_error(fs)) << tz_get_error_name(fs);
  EXPECT_TRUE(f.get(fs) == cpu_compress(data, p));
  const size_t ds = tz_cuda_decompress_tensor(o.p(), data.size(), f.p(), fs, 0);
  ASSERT_EQ(ds, data.size()) << tz_get_error_name(ds);
  EXPECT_TRUE(o.get(data.size()) == data);
  EXPECT_TRUE(tz_is_error(tz_cuda_decompress_tensor(o.p(), data.size(), f.p(), fs - 1, 0)));
}

// The table of malformed frames (one per validation rule): the GPU's status
// codes are the CPU's, except TZ_ERROR_UNSUPPORTED for valid zstd frames.
TEST(CudaGpu, MalformedFramesSameCodeAsCpu) {
  REQUIRE_GPU();
  const std::vector<tzt::MalformedFrame> table = tzt::malformed_frames();
  std::vector<std::unique_ptr<DevBuf>> fs, outs;
  std::vector<tz_cuda_decompress_item> items;
  for (const auto& m : table) {
    fs.push_back(std::make_unique<DevBuf>(m.frame.size()));
    fs.back()->put(m.frame);
    outs.push_back(std::make_unique<DevBuf>(m.dst_capacity));
    items.push_back({fs.back()->p(), m.frame.size(), outs.back()->p(), m.dst_capacity});
  }
  const Result r = gpu_decompress(items);
  for (size_t i = 0; i < table.size(); ++i) {
    SCOPED_TRACE(table[i].rule);
    EXPECT_EQ(r.status[i], table[i].gpu_code);
    EXPECT_TRUE(outs[i]->guards_intact());
  }
}

}  // namespace

// Predicted tensors: cast (BF16/F16 from FP32 masters, inexact in places) and
// delta (F32, BF16): the GPU frame is the CPU frame of the residual, and the
// fused decode returns the values.
TEST(CudaGpu, PredictedCastAndDelta) {
  REQUIRE_GPU();
  struct Case {
    tz_dtype dt;
    int kind;
    Bytes values, pred;
  };
  std::vector<Case> cases;
  std::mt19937 rng(11);
  for (tz_dtype dt : {TZ_DTYPE_BF16, TZ_DTYPE_F16}) {
    const size_t n = 300000 + rng() % 1000;
    std::vector<float> m(n);
    std::normal_distribution<float> nd(0.f, 0.02f);
    for (auto& f : m) f = nd(rng);
    Bytes mb(n * 4), v(n * 2);
    std::memcpy(mb.data(), m.data(), mb.size());
    const int ck = dt == TZ_DTYPE_F16 ? tz::predict::kCastF16 : tz::predict::kCastBF16;
    for (size_t i = 0; i < n; ++i) {
      uint16_t c = tz::predict::cast_f32(tz::load_le32(&mb[4 * i]), ck);
      if (i % 101 == 3) c ^= 0x0003;
      std::memcpy(&v[2 * i], &c, 2);
    }
    cases.push_back({dt, TZ_CUDA_PREDICT_CAST, v, mb});
  }
  for (tz_dtype dt : {TZ_DTYPE_F32, TZ_DTYPE_BF16}) {
    const size_t n = 200000 + rng() % 1000;
    std::vector<float> m(n);
    std::normal_distribution<float> nd(0.f, 0.02f);
    for (auto& f : m) f = nd(rng);
    Bytes prev = dt == TZ_DTYPE_F32 ? Bytes(n * 4) : tzt::to_bf16(m);
    if (dt == TZ_DTYPE_F32) std::memcpy(prev.data(), m.data(), prev.size());
    Bytes cur = prev;
    const size_t es = prev.size() / n;
    for (size_t i = 0; i < n; ++i)
      if (rng() % 3 == 0) cur[i * es] ^= (uint8_t)(1 + rng() % 3);
    cases.push_back({dt, TZ_CUDA_PREDICT_DELTA, cur, prev});
  }
  std::vector<std::unique_ptr<DevBuf>> src, pred, dst, back;
  std::vector<tz_cuda_compress_item> items;
  for (const auto& c : cases) {
    src.push_back(std::make_unique<DevBuf>(c.values.size()));
    src.back()->put(c.values);
    pred.push_back(std::make_unique<DevBuf>(c.pred.size()));
    pred.back()->put(c.pred);
    const size_t cap = tz_compress_bound(c.values.size());
    dst.push_back(std::make_unique<DevBuf>(cap));
    tz_cuda_compress_item it{src.back()->p(), c.values.size(), c.dt, dst.back()->p(), cap, {}};
    it.predict = {c.kind, pred.back()->p(), c.pred.size()};
    items.push_back(it);
  }
  tz_params p{};
  const Result r = gpu_compress(items, p);
  std::vector<tz_cuda_decompress_item> d;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE("case " + std::to_string(i));
    ASSERT_EQ(r.status[i], TZ_OK);
    Bytes resid = c.values;
    if (c.kind == TZ_CUDA_PREDICT_CAST)
      tz::predict::cast_xor(c.pred.data(), resid.data(), resid.size() / 2,
                            c.dt == TZ_DTYPE_F16 ? tz::predict::kCastF16 : tz::predict::kCastBF16);
    else
      tz::predict::xor_bytes(c.pred.data(), resid.data(), resid.size());
    tz_params cp = p;
    cp.dtype = c.dt;
    ASSERT_TRUE(dst[i]->get(r.size[i]) == cpu_compress(resid, cp)) << "GPU frame != CPU frame of the residual";
    back.push_back(std::make_unique<DevBuf>(c.values.size()));
    tz_cuda_decompress_item di{dst[i]->p(), r.size[i], back.back()->p(), c.values.size(), {}};
    di.predict = {c.kind, pred[i]->p(), c.pred.size()};
    d.push_back(di);
  }
  const Result rd = gpu_decompress(d);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    ASSERT_EQ(rd.status[i], TZ_OK);
    ASSERT_TRUE(back[i]->get(cases[i].values.size()) == cases[i].values);
    ASSERT_TRUE(back[i]->guards_intact());
  }
}

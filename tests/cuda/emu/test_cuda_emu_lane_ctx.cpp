// Lane contexts and table sets under the CPU emulation of the CUDA backend:
// the emulated GPU decoder decodes the CPU's level-3 frames (and their
// version-1/2 form, cuda_emu_batch.h, cpu_frames_decode), the encoder
// writes the CPU's level-2 frames with lane contexts, and refuses level 3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_emu_batch.h"

namespace {

using namespace tz_cuda_emu_test;

// Level 3 (lane contexts, exhaustive search) is encoded by the CPU only: the
// GPU encoder refuses it, and the GPU decoder decodes the CPU's frames, in
// a batch that mixes plain frames (first decode launch) and context frames
// (second launch, larger shared memory).
TEST(CudaEmu, LaneContextFramesDecode) {
  std::vector<std::pair<tz_dtype, Bytes>> batch;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (tz_dtype dt : {TZ_DTYPE_F32, TZ_DTYPE_BF16, TZ_DTYPE_F16}) {
    std::vector<float> v(20000 + 7 * dt);
    float scale = 1.0f;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i % 256 == 0) scale = std::ldexp(1.0f, -(int)(rng() % 24));
      const float g = nd(rng);
      v[i] = g * g * scale;
    }
    Bytes b = dt == TZ_DTYPE_BF16 ? tzt::to_bf16(v) : dt == TZ_DTYPE_F16 ? tzt::to_f16(v) : Bytes(v.size() * 4);
    if (dt == TZ_DTYPE_F32) memcpy(b.data(), v.data(), b.size());
    batch.push_back({dt, b});
    batch.push_back({dt, make_tensor(dt, 5000, 9)});
  }
  tz_params p{};
  p.level = 3;
  p.block_elems = 4096;
  const size_t n_ctx = cpu_frames_decode(batch, p);
  EXPECT_GE(n_ctx, 2u) << "the row-scaled tensors should use lane contexts";
  // Levels 1-2 find lane contexts too (format version 3), and the emulated
  // GPU encoder writes the CPU's frames byte for byte.
  p.level = 2;
  EXPECT_GE(cpu_frames_decode(batch, p), 2u);
  roundtrip_batch(batch, p);
  // The GPU encoder refuses level 3.
  p.level = 3;
  Buf src(16), dst(1024);
  std::vector<tz_cuda_compress_item> items{{src.p(), 16, TZ_DTYPE_F32, dst.p(), 1024}};
  EXPECT_EQ(tz_get_error_code(tz_cuda_compress_temp_size(items.data(), 1, &p)), TZ_ERROR_UNSUPPORTED);
}

}  // namespace

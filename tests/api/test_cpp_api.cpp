// The C++ wrapper: round trip, exceptions carrying the C error code and the
// detail text, inspect.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tensorzip/tensorzip.hpp"

namespace {

std::vector<uint8_t> bf16_ramp(size_t n) {
  // Smoothly varying values, rounded to BF16 (top half of the float bits).
  std::vector<uint8_t> out(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const float v = std::sin(0.001f * (float)i) * 0.05f;
    uint32_t bits;
    memcpy(&bits, &v, 4);
    const uint16_t b = (uint16_t)(bits >> 16);
    memcpy(&out[2 * i], &b, 2);
  }
  return out;
}

TEST(CppApi, RoundTripAndInspect) {
  const auto src = bf16_ramp(300000);
  tensorzip::Context ctx(2);
  const auto frame = ctx.compress(src, {tensorzip::DType::BF16});
  EXPECT_LT(frame.size(), src.size());
  const auto info = tensorzip::inspect(frame);
  EXPECT_EQ(info.dtype, tensorzip::DType::BF16);
  EXPECT_EQ(info.raw_size, src.size());
  EXPECT_EQ(info.frame_size, frame.size());
  EXPECT_EQ(ctx.decompress(frame), src);
  EXPECT_EQ(tensorzip::decompress(frame, 1), src);
  EXPECT_NO_THROW(ctx.verify(frame));
}

TEST(CppApi, ErrorsThrowWithCodeAndDetail) {
  const auto src = bf16_ramp(100000);
  auto frame = tensorzip::compress(src, {tensorzip::DType::BF16});
  frame[frame.size() - 9] ^= 0x10;  // inside the last block
  tensorzip::Context ctx(1);
  try {
    ctx.decompress(frame);
    FAIL() << "corrupt frame decoded";
  } catch (const tensorzip::Error& e) {
    EXPECT_TRUE(e.code() == TZ_ERROR_CHECKSUM || e.code() == TZ_ERROR_CORRUPT_BLOCK) << e.what();
    EXPECT_NE(std::string(e.what()).find("block"), std::string::npos) << e.what();
  }
  frame[0] = 'X';
  try {
    ctx.decompress(frame);
    FAIL() << "bad magic accepted";
  } catch (const tensorzip::Error& e) {
    EXPECT_EQ(e.code(), TZ_ERROR_BAD_MAGIC);
  }
  std::vector<uint8_t> small(10);
  const auto good = tensorzip::compress(src, {tensorzip::DType::BF16});
  EXPECT_THROW(ctx.decompress(good, small), tensorzip::Error);
}

}  // namespace

#include <gtest/gtest.h>
#include <vector>
#include <cstring>
#include "tensorzip/tensorzip.h"

TEST(Smoke, RoundTripBF16) {
  std::vector<uint16_t> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 512);
  std::vector<uint8_t> c(tz_compress_bound(v.size() * 2));
  tz_params p{}; p.dtype = TZ_DTYPE_BF16;
  size_t cs = tz_compress(c.data(), c.size(), v.data(), v.size() * 2, &p);
  ASSERT_FALSE(tz_is_error(cs)) << tz_last_error_detail();
  std::vector<uint16_t> d(v.size());
  size_t ds = tz_decompress(d.data(), d.size() * 2, c.data(), cs, 0);
  ASSERT_FALSE(tz_is_error(ds)) << tz_last_error_detail();
  EXPECT_EQ(ds, v.size() * 2);
  EXPECT_EQ(0, memcmp(v.data(), d.data(), ds));
  EXPECT_LT(cs, v.size() * 2);
}

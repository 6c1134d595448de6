// Every CPU kernel set (portable, AVX2, AVX-512, NEON: those this CPU has)
// gives the portable kernels' bytes on encode and their output and status on
// decode, for real pages of every dtype and mode, every fixed code width,
// odd sizes and damaged input.
#include "kv_test_util.hpp"

namespace {

using kvt::Bytes;

void expect_paths_equal(const tz::kv::Codec& codec, const Bytes& page, const std::string& what) {
  const Bytes ref = kvt::encode(codec, kvt::portable(), page.data(), page.size());
  Bytes ref_out;
  ASSERT_EQ(kvt::decode(codec, kvt::portable(), ref, &ref_out), page.size()) << what;
  ASSERT_EQ(ref_out, page) << what;
  for (const auto& [name, k] : kvt::all_paths()) {
    const Bytes enc = kvt::encode(codec, *k, page.data(), page.size());
    EXPECT_EQ(enc, ref) << what << " path " << name;
    Bytes out;
    EXPECT_EQ(kvt::decode(codec, *k, ref, &out), page.size()) << what << " path " << name;
    EXPECT_EQ(out, page) << what << " path " << name;
  }
}

TEST(KvPaths, ListsThePathsOfThisCpu) {
  const auto paths = kvt::all_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths[0].first, "portable");
  std::string names;
  for (const auto& p : paths) names += p.first + " ";
  std::printf("KV kernel sets tested: %s(active: %s)\n", names.c_str(),
              tz::cpu::simd_path_name(tz::cpu::active_simd_path()));
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) {
    EXPECT_NE(tz::kv::page_kernels(tz::cpu::SimdPath::kAvx2), nullptr);
  }
#endif
#if defined(__aarch64__)
  EXPECT_NE(tz::kv::page_kernels(tz::cpu::SimdPath::kNeon), nullptr);
#endif
}

TEST(KvPaths, RealPagesEveryDtypeAndMode) {
  for (uint8_t dt : {tz::kBF16, tz::kF16, tz::kF8E4M3, tz::kF8E5M2}) {
    const Bytes sample = kvt::cast_bf16(kvt::sequence("k", 0), dt);
    const Bytes data = kvt::cast_bf16(kvt::sequence("v", 1), dt);
    for (int mode : {TZ_KV_MODE_RANS, TZ_KV_MODE_FIXED}) {
      for (int no_crc : {0, 1}) {
        tz_kv_params p{};
        p.mode = (tz_kv_mode)mode;
        p.no_checksum = no_crc;
        auto codec = kvt::calibrate(sample, dt, p);
        for (uint32_t tokens : {16u, 64u, 256u}) {
          const size_t bytes = (size_t)tokens * kvt::kRowElems * tz::dtype_elem_size(dt);
          expect_paths_equal(*codec, Bytes(data.begin(), data.begin() + (ptrdiff_t)bytes),
                             std::string(tz_dtype_name((tz_dtype)dt)) + " mode " + std::to_string(mode) + " " +
                                 std::to_string(tokens) + " tokens");
        }
      }
    }
  }
}

TEST(KvPaths, EveryFixedWidthAndOddSizes) {
  const Bytes sample = kvt::sequence("v", 0);
  const Bytes data = kvt::sequence("k", 1);
  for (unsigned bits = 1; bits <= tz::kv::kMaxFixedBits; ++bits) {
    tz_kv_params p{};
    p.mode = TZ_KV_MODE_FIXED;
    p.fixed_bits = bits;
    auto codec = kvt::calibrate(sample, tz::kBF16, p);
    // (200 .. 1000: the SIMD coders' 512-element chunks, whole, partial and
    // a page shorter than one, whose scratch areas must not overlap.)
    for (uint32_t n : {1u, 5u, 31u, 32u, 33u, 64u, 95u, 200u, 300u, 511u, 512u, 513u, 1000u, 4096u, 4131u})
      expect_paths_equal(*codec, Bytes(data.begin() + 6, data.begin() + 6 + 2 * n),
                         "bits " + std::to_string(bits) + " n " + std::to_string(n));
  }
  auto rans = kvt::calibrate(sample, tz::kBF16);
  for (uint32_t n = 1; n < 300; n += 7)
    expect_paths_equal(*rans, Bytes(data.begin() + 2 * n, data.begin() + 4 * n), "rANS n " + std::to_string(n));
}

// Damaged pages: each path reports the same status as the portable one.
// Without checksums the damage reaches the payload decoders; with them the
// SIMD kernel sets decode the payload before they verify the checksum
// (kChecksumAfterPayload) and must still report what the portable one, which
// verifies first, reports: the checksum error for any damage the layout
// checks let through, the layout's error otherwise.
TEST(KvPaths, DamagedPagesSameStatus) {
  const Bytes sample = kvt::sequence("k", 0);
  const Bytes data = kvt::sequence("k", 1);
  for (int mode : {TZ_KV_MODE_RANS, TZ_KV_MODE_FIXED}) {
    for (int no_crc : {1, 0}) {
      tz_kv_params p{};
      p.mode = (tz_kv_mode)mode;
      p.no_checksum = no_crc;
      auto codec = kvt::calibrate(sample, tz::kBF16, p);
      const Bytes page = kvt::encode(*codec, kvt::portable(), data.data(), 2 * 4096);
      uint64_t rng = 12345;
      size_t checksum_errors = 0;
      for (int trial = 0; trial < 600; ++trial) {
        Bytes bad = page;
        rng = tzt::splitmix64(rng);
        // With checksums, the checksum field (bytes 12..15) too.
        const size_t from = no_crc ? tz::kv::kPageHeaderSize : 12;
        const size_t pos = from + rng % (bad.size() - from);
        bad[pos] ^= (uint8_t)(1u + (rng >> 40) % 255);
        if (trial % 3 == 0) bad[from + (rng >> 20) % (bad.size() - from)] ^= 0x10;  // and a second byte
        Bytes ref_out;
        const size_t ref = kvt::decode(*codec, kvt::portable(), bad, &ref_out);
        if (!no_crc) {
          EXPECT_TRUE(tz_is_error(ref)) << "trial " << trial;
          checksum_errors += tz_get_error_code(ref) == TZ_ERROR_CHECKSUM;
        }
        for (const auto& [name, k] : kvt::all_paths()) {
          Bytes out;
          const size_t r = kvt::decode(*codec, *k, bad, &out);
          EXPECT_EQ(r, ref) << name << " mode " << mode << " no_crc " << no_crc << " trial " << trial;
          if (!tz_is_error(r)) {
            EXPECT_EQ(out, ref_out) << name;
          }
        }
      }
      if (!no_crc) {
        EXPECT_GT(checksum_errors, 500u) << "mode " << mode;  // most damage passes the layout checks
      }
    }
  }
}

}  // namespace

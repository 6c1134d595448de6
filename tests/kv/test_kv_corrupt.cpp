// Damaged and hostile pages: every bit flip of a checksummed page is an
// error; truncation, trailing bytes, other tables, bad header fields are
// errors; without checksums damage is either an error or a page of the right
// size, never a read or write outside the buffers (the debug preset's ASan
// checks that); the decoder never reads past the page it was given.
#include "kv_test_util.hpp"

namespace {

using kvt::Bytes;

std::unique_ptr<tz::kv::Codec> codec_for(int mode, int no_crc) {
  tz_kv_params p{};
  p.mode = (tz_kv_mode)mode;
  p.no_checksum = no_crc;
  return kvt::calibrate(kvt::sequence("v", 0), tz::kBF16, p);
}

// A real page of n elements with one special value (so that it has a literal).
Bytes real_page(const tz::kv::Codec& c, uint32_t n) {
  const Bytes seq = kvt::sequence("v", 1);
  Bytes src(seq.begin(), seq.begin() + 2 * n);
  tz::store_le16(src.data() + 2 * (n / 2), 0x7F80);  // +inf
  return kvt::encode(c, kvt::portable(), src.data(), src.size());
}

TEST(KvCorrupt, EveryBitFlipDetected) {
  for (int mode : {TZ_KV_MODE_RANS, TZ_KV_MODE_FIXED}) {
    auto c = codec_for(mode, 0);
    const Bytes page = real_page(*c, 512);
    ASSERT_NE(page[3], tz::kv::kPageStored);
    for (size_t i = 0; i < page.size(); ++i)
      for (int b = 0; b < 8; ++b) {
        Bytes bad = page;
        bad[i] ^= (uint8_t)(1u << b);
        Bytes out;
        EXPECT_TRUE(tz_is_error(kvt::decode(*c, kvt::portable(), bad, &out))) << "mode " << mode << " byte " << i;
      }
  }
}

TEST(KvCorrupt, TruncatedOrExtended) {
  for (int mode : {TZ_KV_MODE_RANS, TZ_KV_MODE_FIXED})
    for (int no_crc : {0, 1}) {
      auto c = codec_for(mode, no_crc);
      const Bytes page = real_page(*c, 700);
      for (const auto& [name, k] : kvt::all_paths()) {
        for (size_t n = 0; n < page.size(); ++n) {
          // An exact-size heap copy so that ASan sees any read past it.
          std::unique_ptr<uint8_t[]> buf(new uint8_t[n ? n : 1]);
          memcpy(buf.get(), page.data(), n);
          Bytes out(2 * 700);
          EXPECT_TRUE(tz_is_error(c->decode(*k, out.data(), out.size(), buf.get(), n))) << name << " " << n;
        }
        Bytes longer = page;
        longer.push_back(0);
        Bytes out;
        EXPECT_TRUE(tz_is_error(kvt::decode(*c, *k, longer, &out))) << name;
      }
    }
}

TEST(KvCorrupt, WrongTablesAndHeaderFields) {
  auto a = codec_for(TZ_KV_MODE_RANS, 0);
  auto fixed = codec_for(TZ_KV_MODE_FIXED, 0);
  auto other = kvt::calibrate(kvt::sequence("k", 0), tz::kBF16);
  const Bytes page = real_page(*a, 300);
  Bytes out;
  EXPECT_EQ(tz_get_error_code(kvt::decode(*other, kvt::portable(), page, &out)), TZ_ERROR_BAD_PARAMETER);
  EXPECT_EQ(tz_get_error_code(kvt::decode(*fixed, kvt::portable(), page, &out)), TZ_ERROR_BAD_PARAMETER);
  EXPECT_NE(std::string(tz_last_error_detail()).find("other tables"), std::string::npos);
  Bytes bad = page;
  bad[0] = 'X';
  EXPECT_EQ(tz_get_error_code(kvt::decode(*a, kvt::portable(), bad, &out)), TZ_ERROR_BAD_MAGIC);
  bad = page;
  bad[2] = 2;
  EXPECT_EQ(tz_get_error_code(kvt::decode(*a, kvt::portable(), bad, &out)), TZ_ERROR_BAD_VERSION);
  bad = page;
  tz::store_le32(bad.data() + 8, 0);  // no elements
  EXPECT_TRUE(tz_is_error(kvt::decode(*a, kvt::portable(), bad, &out)));
  // A destination shorter than the page's size.
  Bytes small(599);
  EXPECT_EQ(tz_get_error_code(a->decode(kvt::portable(), small.data(), small.size(), page.data(), page.size())),
            TZ_ERROR_DST_TOO_SMALL);
}

// Without checksums: random damage of every kind decodes to an error or to
// exactly n elements, on every path, with exact-size buffers.
TEST(KvCorrupt, NoChecksumRandomDamage) {
  for (int mode : {TZ_KV_MODE_RANS, TZ_KV_MODE_FIXED}) {
    auto c = codec_for(mode, 1);
    const Bytes page = real_page(*c, 1000);
    uint64_t rng = 99 + (uint64_t)mode;
    size_t errors = 0, total = 0;
    for (int trial = 0; trial < 400; ++trial) {
      Bytes bad = page;
      rng = tzt::splitmix64(rng);
      const int kind = (int)(rng % 3);
      if (kind == 0) {
        bad[16 + (rng >> 8) % (bad.size() - 16)] ^= (uint8_t)(1 + (rng >> 32) % 255);
      } else if (kind == 1) {
        for (int j = 0; j < 8; ++j) bad[(tzt::splitmix64(rng + (uint64_t)j)) % bad.size()] = (uint8_t)(rng >> (8 * j));
      } else {
        bad.resize(16 + (rng >> 16) % (bad.size() - 16));
      }
      for (const auto& [name, k] : kvt::all_paths()) {
        std::unique_ptr<uint8_t[]> in(new uint8_t[bad.size()]);
        memcpy(in.get(), bad.data(), bad.size());
        std::unique_ptr<uint8_t[]> out(new uint8_t[2000]);
        const size_t r = c->decode(*k, out.get(), 2000, in.get(), bad.size());
        EXPECT_TRUE(tz_is_error(r) || r == 2000u) << name;
        errors += tz_is_error(r);
        ++total;
      }
    }
    std::printf("mode %d without checksum: %zu of %zu damaged pages rejected\n", mode, errors, total);
    EXPECT_GT(errors, 0u);
  }
}

}  // namespace

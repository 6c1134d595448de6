// Unit tests of the smaller codec pieces: CRC32C and the block checksum,
// the fixed-point log2 of the cost model, the field split, and the error
// names of the C ABI.
#include <cmath>
#include <set>
#include <thread>

#include "codec/checksum.h"
#include "codec/cost.h"
#include "codec/fields.h"
#include "codec/rans.h"
#include "cpu/checksum_cpu.h"
#include "cpu/checksum_fold.h"
#include "tz_test_util.h"

using namespace tzt;

namespace {

// ------------------------------------------------------------- checksums --

struct CrcTable {
  uint32_t t[256];
  CrcTable() { tz::crc32c_make_table(t); }
};
const CrcTable kTable;

// Bit-at-a-time CRC32C, straight from the definition (reflected 0x82F63B78).
uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Crc32c, StandardCheckValues) {
  const uint8_t* check = (const uint8_t*)"123456789";
  EXPECT_EQ(tz::crc32c(check, 9, kTable.t), 0xE3069283u);
  EXPECT_EQ(tz::cpu::crc32c(check, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_bitwise(check, 9), 0xE3069283u);
  // RFC 3720 (iSCSI) B.4 test vectors.
  uint8_t buf[32];
  memset(buf, 0, 32);
  EXPECT_EQ(tz::cpu::crc32c(buf, 32), 0x8A9136AAu);
  memset(buf, 0xFF, 32);
  EXPECT_EQ(tz::cpu::crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = (uint8_t)i;
  EXPECT_EQ(tz::cpu::crc32c(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = (uint8_t)(31 - i);
  EXPECT_EQ(tz::cpu::crc32c(buf, 32), 0x113FDB5Cu);
  EXPECT_EQ(tz::cpu::crc32c(nullptr, 0), 0u);
  std::printf("  hardware CRC32C: %s\n", tz::cpu::crc32c_hw_available() ? "yes" : "no");
}

TEST(Crc32c, ImplementationsAgree) {
  const Bytes data = hash_stream(100000, 7);
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4096, 99999}) {
    for (size_t misalign : {0, 1, 3, 5}) {
      if (n + misalign > data.size()) continue;
      const uint8_t* p = data.data() + misalign;
      const uint32_t ref = crc32c_bitwise(p, n);
      ASSERT_EQ(tz::crc32c(p, n, kTable.t), ref) << n;
      ASSERT_EQ(tz::cpu::crc32c(p, n), ref) << n << " misaligned by " << misalign;
      // Incremental updates over any split equal the one-shot CRC.
      const size_t cut = n / 3;
      uint32_t st = tz::cpu::crc32c_update(~0u, p, cut);
      st = tz::cpu::crc32c_update(st, p + cut, n - cut);
      ASSERT_EQ(~st, ref);
      uint32_t st2 = tz::crc32c_update(~0u, p, cut, kTable.t);
      st2 = tz::crc32c_update(st2, p + cut, n - cut, kTable.t);
      ASSERT_EQ(~st2, ref);
    }
  }
}

// The CRC32C paths this CPU can run (the table always).
static std::vector<tz::cpu::Crc32cPath> crc32c_paths() {
  std::vector<tz::cpu::Crc32cPath> v;
  for (int i = 0; i <= 3; ++i)
    if (tz::cpu::crc32c_path_supported((tz::cpu::Crc32cPath)i)) v.push_back((tz::cpu::Crc32cPath)i);
  return v;
}

// Interleaved streams (the segment CRCs of a block or KV page in one pass):
// every stream's state equals the table reference run on it alone, for every
// stream count, lengths that differ (0, under 8, not multiples of 8, long),
// misaligned starts and any initial state.
TEST(Crc32c, StreamsEqualOneAtATime) {
  const Bytes data = hash_stream(8 * 5000 + 64, 13);
  std::printf("  CRC32C path: %s\n", tz::cpu::crc32c_path());
  uint64_t seed = 0;
  for (int k = 1; k <= tz::cpu::kCrc32cMaxStreams; ++k) {
    for (int trial = 0; trial < 60; ++trial) {
      uint32_t st[tz::cpu::kCrc32cMaxStreams], want[tz::cpu::kCrc32cMaxStreams];
      const uint8_t* p[tz::cpu::kCrc32cMaxStreams];
      size_t n[tz::cpu::kCrc32cMaxStreams];
      for (int j = 0; j < k; ++j) {
        const uint64_t r = splitmix64(seed++);
        const size_t lens[] = {0, 1, 7, 8, 9, 1024, 1023, 4096, (size_t)(r % 5000)};
        n[j] = trial < 9 ? lens[(trial + j) % 9] : (size_t)((r >> 20) % 5000);
        p[j] = data.data() + (size_t)j * 5000 + (size_t)((r >> 40) % 64);
        st[j] = trial % 2 ? ~0u : (uint32_t)(r >> 8);
        want[j] = tz::crc32c_update(st[j], p[j], n[j], kTable.t);
      }
      for (tz::cpu::Crc32cPath path : crc32c_paths()) {
        uint32_t got[tz::cpu::kCrc32cMaxStreams];
        memcpy(got, st, sizeof got);
        tz::cpu::crc32c_update_streams_on(path, got, p, n, k);
        for (int j = 0; j < k; ++j)
          ASSERT_EQ(got[j], want[j]) << tz::cpu::crc32c_path_name(path) << ", " << k << " streams, trial " << trial
                                     << ", stream " << j;
      }
      tz::cpu::crc32c_update_streams(st, p, n, k);
      for (int j = 0; j < k; ++j) ASSERT_EQ(st[j], want[j]) << k << " streams, trial " << trial << ", stream " << j;
    }
  }
}

// Every path (table, CRC instruction, PCLMULQDQ and VPCLMULQDQ folding where
// this CPU has them) against the table: every length 0..5000 from every
// start alignment 0..63 with a random initial state (the reference states
// of all prefixes come from one incremental pass), then random lengths up to
// 70 KB at random alignments and states (the 512-bit path's four-accumulator
// loop and every tail length). A wrong folding constant fails here.
TEST(Crc32c, EveryPathEqualsTableEveryLength) {
  const Bytes data = hash_stream(72 * 1024 + 64, 17);
  std::vector<uint32_t> want(5001);
  for (tz::cpu::Crc32cPath path : crc32c_paths()) std::printf("  CRC32C path tested: %s\n", tz::cpu::crc32c_path_name(path));
  for (size_t align = 0; align < 64; ++align) {
    const uint8_t* p = data.data() + align;
    const uint32_t s0 = align % 8 == 0 ? ~0u : (uint32_t)splitmix64(align + 1000);
    want[0] = s0;
    for (size_t n = 1; n <= 5000; ++n) want[n] = tz::crc32c_update(want[n - 1], p + n - 1, 1, kTable.t);
    for (tz::cpu::Crc32cPath path : crc32c_paths())
      for (size_t n = 0; n <= 5000; ++n)
        ASSERT_EQ(tz::cpu::crc32c_update_on(path, s0, p, n), want[n])
            << tz::cpu::crc32c_path_name(path) << ", length " << n << ", alignment " << align;
  }
  for (uint64_t t = 0; t < 300; ++t) {
    const uint64_t r = splitmix64(t + 77);
    const size_t n = (size_t)(r % (70 * 1000 + 1)), align = (size_t)(r >> 40) % 64;
    const uint32_t s0 = (uint32_t)(r >> 7);
    const uint32_t ref = tz::crc32c_update(s0, data.data() + align, n, kTable.t);
    for (tz::cpu::Crc32cPath path : crc32c_paths())
      ASSERT_EQ(tz::cpu::crc32c_update_on(path, s0, data.data() + align, n), ref)
          << tz::cpu::crc32c_path_name(path) << ", length " << n << ", alignment " << align;
  }
}

// The folding constants are x^e mod P (reflected, shifted into the high 32
// bits) for the distances they are named with, recomputed here bit by bit
// from the polynomial (scripts/crc32c_fold_constants.py documents the
// derivation); and a wrong one (one bit flipped) makes folding differ from
// the table, which the test above would then catch.
TEST(Crc32c, FoldConstantsFromPolynomial) {
  auto xpow_mod = [](size_t e) {
    uint64_t r = 1;
    for (size_t i = 0; i < e; ++i) {
      r <<= 1;
      if (r & (1ull << 32)) r ^= 0x11EDC6F41ull;
    }
    return (uint32_t)r;
  };
  auto reflect32 = [](uint32_t v) {
    uint32_t o = 0;
    for (int i = 0; i < 32; ++i) o |= ((v >> i) & 1u) << (31 - i);
    return o;
  };
  namespace fold = tz::cpu::fold;
  for (int i = 0; i < fold::kNumConst; ++i) {
    const size_t d = 8 * fold::kConstBytes[i];
    EXPECT_EQ(fold::kConst[i][0], (uint64_t)reflect32(xpow_mod(d + 63)) << 32) << fold::kConstBytes[i] << " bytes";
    EXPECT_EQ(fold::kConst[i][1], (uint64_t)reflect32(xpow_mod(d - 1)) << 32) << fold::kConstBytes[i] << " bytes";
  }
  // x^(D-1), not x^D: the off-by-one the carry-less product's bit order asks for.
  EXPECT_NE(fold::kConst[1][1], (uint64_t)reflect32(xpow_mod(512)) << 32);
}

// Block checksum = CRC32C of the LE32 CRC32Cs of 4096-byte segments
// (src/codec/checksum.h). Fast CPU version vs the portable reference vs a
// third version written here from that definition.
TEST(BlockChecksum, CpuMatchesReference) {
  const Bytes data = hash_stream(5 * 4096 * 4 + 100, 11);
  std::vector<size_t> lengths = {0, 1, 3, 4095, 4096, 4097, 8192, 3 * 4096 - 1, 3 * 4096, 3 * 4096 + 1,
                                 6 * 4096, 7 * 4096 + 5, 5 * 4096 * 4};
  for (uint64_t i = 0; i < 60; ++i) lengths.push_back(splitmix64(i) % (data.size() - 8));
  for (size_t n : lengths) {
    for (size_t misalign : {0, 1, 6}) {
      const uint8_t* p = data.data() + misalign;
      const uint32_t ref = tz::block_checksum_ref(p, n, kTable.t);
      ASSERT_EQ(tz::cpu::block_checksum(p, n), ref) << "length " << n << " misaligned by " << misalign;
      Bytes list;
      for (size_t off = 0; off < n; off += 4096) {
        const uint32_t c = crc32c_bitwise(p + off, std::min<size_t>(4096, n - off));
        for (int k = 0; k < 4; ++k) list.push_back((uint8_t)(c >> (8 * k)));
      }
      ASSERT_EQ(crc32c_bitwise(list.data(), list.size()), ref) << "length " << n;
    }
  }
  // Any single-bit change anywhere in a block changes its checksum.
  Bytes blk(3 * 4096 + 77);
  memcpy(blk.data(), data.data(), blk.size());
  const uint32_t base = tz::cpu::block_checksum(blk.data(), blk.size());
  for (size_t bit = 0; bit < 8 * blk.size(); bit += 13) {
    blk[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    ASSERT_NE(tz::cpu::block_checksum(blk.data(), blk.size()), base) << "bit " << bit;
    blk[bit / 8] ^= (uint8_t)(1u << (bit % 8));
  }
}

// ------------------------------------------------------------- log2_fix16 --

TEST(CostModel, Log2Fix16WithinTwoToMinus15) {
  const double tol = std::ldexp(1.0, -15);
  auto check = [&](uint32_t v) {
    const double got = tz::log2_fix16(v) / 65536.0;
    const double want = std::log2((double)v);
    ASSERT_NEAR(got, want, tol) << "v = " << v;
    ASSERT_LE(got, want + 1e-12) << "v = " << v << ": not truncated";
  };
  for (uint32_t v = 1; v <= 70000; ++v) check(v);
  for (int k = 0; k < 32; ++k) {
    check(1u << k);
    EXPECT_EQ(tz::log2_fix16(1u << k), (uint32_t)k << 16);
    if (k > 1) {
      check((1u << k) - 1);
      check((1u << k) + 1);
    }
  }
  check(0xFFFFFFFFu);
  for (uint64_t i = 0; i < 100000; ++i) check((uint32_t)(splitmix64(i) | 1));
}

// The host's table of symbol costs holds exactly what the device computes.
TEST(CostModel, SymbolCostTableEqualsTheComputedCost) {
  for (uint32_t f = 0; f <= tz::kProbScale; ++f)
    ASSERT_EQ(tz::symbol_cost_fix16(f), (tz::kProbBits << 16) - (f ? tz::log2_fix16(f) : 0u)) << "f = " << f;
  EXPECT_EQ(tz::symbol_cost_fix16(tz::kProbScale), 0u);
  EXPECT_EQ(tz::symbol_cost_fix16(1), tz::kProbBits << 16);
}

TEST(CostModel, EstimateTracksActualCodedSize) {
  // The cost model decides whether a stream is coded: its estimate must be
  // close to what rans_encode actually produces.
  const Bytes& src = real_data(TZ_DTYPE_BF16);
  const size_t n = src.size() / 2;
  Bytes expo(n);
  for (size_t i = 0; i < n; ++i) expo[i] = (uint8_t)(((src[2 * i + 1] << 8 | src[2 * i]) >> 7) & 0xFF);
  std::array<uint64_t, 256> counts{};
  for (uint8_t s : expo) ++counts[s];
  std::array<uint32_t, 256> freq{};
  tz::rans_normalize(counts.data(), freq.data());
  std::vector<tz::RansEncSym> enc(256);
  tz::rans_build_enc(freq.data(), enc.data());
  const uint32_t B = 65536;
  const uint64_t n_blocks = (n + B - 1) / B;
  uint64_t actual = 0;
  std::vector<uint16_t> words(B);
  Bytes out(tz::kRansStateBytes + 2 * B);
  for (size_t b0 = 0; b0 < n; b0 += B) {
    const uint32_t nb = (uint32_t)std::min<size_t>(B, n - b0);
    const size_t sz = tz::rans_encode(expo.data() + b0, nb, enc.data(), words.data(), out.data(), SIZE_MAX);
    ASSERT_GT(sz, 0u);
    actual += sz;
  }
  uint8_t tbuf[tz::kFreqTableMaxBytes];
  const size_t tbytes = tz::rans_write_table(freq.data(), tbuf);
  const uint64_t est = tz::coded_stream_bytes(counts.data(), freq.data(), n_blocks, tbytes);
  EXPECT_GE(est + 64 * n_blocks, actual + tbytes) << "estimate " << est << ", actual " << actual;
  EXPECT_LE(est, (actual + tbytes) * 1.01 + 200) << "estimate " << est << ", actual " << actual;
}

TEST(CostModel, StreamPaysPolicy) {
  // Level 1: at least 1% saved. Level 2 and 3: any saving.
  EXPECT_FALSE(tz::stream_pays(1, 99, 100));
  EXPECT_TRUE(tz::stream_pays(1, 98, 100));
  EXPECT_FALSE(tz::stream_pays(1, 100, 100));
  EXPECT_TRUE(tz::stream_pays(2, 99, 100));
  EXPECT_FALSE(tz::stream_pays(2, 100, 100));
  EXPECT_TRUE(tz::stream_pays(3, 0, 1));
  EXPECT_FALSE(tz::stream_pays(1, UINT64_C(1) << 50, UINT64_C(1) << 50));
}

// ------------------------------------------------------------ field split --

TEST(Fields, SplitMergeInverseForAll16BitValues) {
  Bytes all(65536 * 2);
  for (uint32_t v = 0; v < 65536; ++v) {
    all[2 * v] = (uint8_t)v;
    all[2 * v + 1] = (uint8_t)(v >> 8);
    uint8_t s0, s1;
    tz::split_elem_bf16((uint16_t)v, s0, s1);
    // doc/format.md 4: S0 = exponent, S1 = sign << 7 | mantissa.
    ASSERT_EQ(s0, (v >> 7) & 0xFF);
    ASSERT_EQ(s1, ((v >> 15) << 7) | (v & 0x7F));
    ASSERT_EQ(tz::merge_elem_bf16(s0, s1), v);
  }
  for (uint8_t dt : {tz::kBF16, tz::kF16}) {
    Bytes s0(65536), s1(65536), back(all.size());
    uint8_t* streams[4] = {s0.data(), s1.data(), nullptr, nullptr};
    tz::split_fields(dt, all.data(), 65536, streams);
    for (uint32_t v = 0; v < 65536; ++v) {
      if (dt == tz::kF16) {
        ASSERT_EQ(s0[v], v >> 8);  // sign, exponent, top two mantissa bits
        ASSERT_EQ(s1[v], v & 0xFF);
      } else {
        ASSERT_EQ(s0[v], (v >> 7) & 0xFF);
      }
    }
    const uint8_t* cstreams[4] = {s0.data(), s1.data(), nullptr, nullptr};
    tz::merge_fields(dt, cstreams, 65536, back.data());
    ASSERT_EQ(back, all) << "dtype " << (int)dt;
  }
}

TEST(Fields, SplitMergeInverseForFloat32AndBytes) {
  const size_t n = 300000;
  Bytes src = hash_stream(4 * n, 5);
  const uint32_t specials[] = {0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00001u, 1, 0x7F7FFFFFu, 0xFFFFFFFFu};
  memcpy(src.data(), specials, sizeof specials);
  Bytes s[4] = {Bytes(n), Bytes(n), Bytes(n), Bytes(n)};
  uint8_t* streams[4] = {s[0].data(), s[1].data(), s[2].data(), s[3].data()};
  tz::split_fields(tz::kF32, src.data(), (uint32_t)n, streams);
  for (size_t i = 0; i < n; ++i) {
    uint32_t v;
    memcpy(&v, src.data() + 4 * i, 4);
    ASSERT_EQ(s[0][i], (v >> 23) & 0xFF);
    ASSERT_EQ(s[1][i], ((v >> 31) << 7) | ((v >> 16) & 0x7F));
    ASSERT_EQ(s[2][i], (v >> 8) & 0xFF);
    ASSERT_EQ(s[3][i], v & 0xFF);
  }
  Bytes back(src.size());
  const uint8_t* cs[4] = {s[0].data(), s[1].data(), s[2].data(), s[3].data()};
  tz::merge_fields(tz::kF32, cs, (uint32_t)n, back.data());
  ASSERT_EQ(back, src);
  for (uint8_t dt : {tz::kBytes, tz::kF8E4M3, tz::kF8E5M2}) {
    Bytes one(n), b2(n);
    uint8_t* st[4] = {one.data(), nullptr, nullptr, nullptr};
    tz::split_fields(dt, src.data(), (uint32_t)n, st);
    ASSERT_TRUE(std::equal(one.begin(), one.end(), src.begin()));
    const uint8_t* cst[4] = {one.data(), nullptr, nullptr, nullptr};
    tz::merge_fields(dt, cst, (uint32_t)n, b2.data());
    ASSERT_TRUE(std::equal(b2.begin(), b2.end(), src.begin()));
  }
}

TEST(Fields, DtypeTablesMatchPublicEnum) {
  static_assert((int)tz::kBytes == TZ_DTYPE_BYTES && (int)tz::kBF16 == TZ_DTYPE_BF16 &&
                (int)tz::kF16 == TZ_DTYPE_F16 && (int)tz::kF32 == TZ_DTYPE_F32 &&
                (int)tz::kF8E4M3 == TZ_DTYPE_F8_E4M3 && (int)tz::kF8E5M2 == TZ_DTYPE_F8_E5M2);
  for (tz_dtype dt : kAllDtypes) {
    EXPECT_EQ(tz::dtype_elem_size((uint8_t)dt), elem_size(dt));
    EXPECT_GE(tz::dtype_stream_count((uint8_t)dt), 1);
    EXPECT_LE(tz::dtype_stream_count((uint8_t)dt), tz::kMaxStreams);
  }
}

// ---------------------------------------------------------------- errors --

TEST(Errors, EveryCodeHasADistinctName) {
  std::set<std::string> names;
  for (int c = 0; c < TZ_ERROR_MAX_CODE; ++c) {
    const char* name = tz_error_code_name((tz_error_code)c);
    ASSERT_NE(name, nullptr);
    EXPECT_STRNE(name, "") << c;
    EXPECT_TRUE(names.insert(name).second) << "duplicate name '" << name << "' for code " << c;
  }
  // Codes outside the enum still get a (non-colliding) name.
  const char* unknown = tz_error_code_name(TZ_ERROR_MAX_CODE);
  ASSERT_NE(unknown, nullptr);
  EXPECT_EQ(names.count(unknown), 0u);
  EXPECT_NE(tz_error_code_name((tz_error_code)15), nullptr);
}

TEST(Errors, FoldedCodes) {
  for (int c = 1; c < TZ_ERROR_MAX_CODE; ++c) {
    const size_t r = (size_t)0 - (size_t)c;
    EXPECT_TRUE(tz_is_error(r)) << c;
    EXPECT_EQ(tz_get_error_code(r), (tz_error_code)c);
    EXPECT_STREQ(tz_get_error_name(r), tz_error_code_name((tz_error_code)c));
  }
  for (size_t ok : {size_t(0), size_t(1), size_t(1) << 40, SIZE_MAX / 2, (size_t)0 - 64}) {
    EXPECT_FALSE(tz_is_error(ok)) << ok;
    EXPECT_EQ(tz_get_error_code(ok), TZ_OK);
  }
  // The internal status codes are the public ones.
  static_assert((int)tz::kErrChecksum == TZ_ERROR_CHECKSUM && (int)tz::kErrCorruptBlock == TZ_ERROR_CORRUPT_BLOCK &&
                (int)tz::kErrBadMagic == TZ_ERROR_BAD_MAGIC && (int)tz::kErrBadVersion == TZ_ERROR_BAD_VERSION &&
                (int)tz::kErrAlloc == TZ_ERROR_ALLOCATION && (int)tz::kErrSrcTruncated == TZ_ERROR_SRC_TRUNCATED &&
                (int)tz::kErrCorruptHeader == TZ_ERROR_CORRUPT_HEADER && (int)tz::kErrBadParam == TZ_ERROR_BAD_PARAMETER &&
                (int)tz::kErrDstTooSmall == TZ_ERROR_DST_TOO_SMALL && (int)tz::kErrUnsupported == TZ_ERROR_UNSUPPORTED);
}

TEST(Errors, DtypeNamesAndVersion) {
  std::set<std::string> names;
  for (tz_dtype dt : kAllDtypes) {
    const std::string n = tz_dtype_name(dt);
    EXPECT_FALSE(n.empty());
    EXPECT_TRUE(names.insert(n).second) << n;
  }
  EXPECT_EQ(names.count(tz_dtype_name((tz_dtype)7)), 0u);
  EXPECT_EQ(tz_version_number(), (unsigned)(TZ_VERSION_MAJOR * 10000 + TZ_VERSION_MINOR * 100 + TZ_VERSION_PATCH));
}

TEST(Errors, DetailIsPerThreadAndDescribesTheError) {
  uint8_t junk[64] = {'T', 'Z', 'F', 'R', 9};
  uint8_t out[16];
  const size_t r = tz_decompress(out, sizeof out, junk, sizeof junk, 1);
  ASSERT_EQ(tz_get_error_code(r), TZ_ERROR_BAD_VERSION);
  const std::string detail = tz_last_error_detail();
  EXPECT_NE(detail.find("9"), std::string::npos) << detail;
  std::string other = "unset";
  std::thread([&] { other = tz_last_error_detail(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(std::string(tz_last_error_detail()), detail);
}

}  // namespace

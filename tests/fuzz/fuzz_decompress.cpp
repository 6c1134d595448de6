// Fuzz target for every decoder entry point of the C ABI: tz_frame_prefix_size,
// tz_frame_inspect, tz_verify, tz_decompress (one-shot and context, with a
// bounded destination), tz_frame_block_range and tz_decompress_blocks.
// Invariants: no crash or sanitizer report on any input; the entry points
// agree with each other; a frame that decodes also decodes block by block to
// the same bytes.
//
// The header CRC covers the header, tables and block index, so almost every
// mutation of a frame stops at that check. Each input is therefore run twice:
// as given, and with its header CRC recomputed, so that mutated tables,
// indexes and blocks reach the block decoders.
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/crc32c.h"
#include "fuzz_check.h"
#include "tensorzip/tensorzip.h"

namespace {
// Frames claiming more than this are only inspected: a block of one
// repeated symbol costs ~130 bytes per 2^20 elements, so tiny inputs can
// describe gigabytes, which is valid but would only make the fuzzer slow.
constexpr uint64_t kMaxRaw = uint64_t(64) << 20;

// Rewrites the header CRC of a frame in place (doc/format.md 3: CRC32C of
// header bytes 0..27, the table section and the block index). Returns false
// when the buffer does not hold the prefix the header describes.
bool fix_header_crc(std::vector<uint8_t>& f) {
  if (f.size() < 32) return false;
  uint32_t tables_size, n_blocks;
  memcpy(&tables_size, f.data() + 24, 4);
  memcpy(&n_blocks, f.data() + 20, 4);
  const uint64_t prefix = 32 + (uint64_t)tables_size + 4ull * n_blocks;
  if (prefix > f.size()) return false;
  static uint32_t table[256];
  static const bool init = (tz::crc32c_make_table(table), true);
  (void)init;
  uint32_t st = tz::crc32c_update(~0u, f.data(), 28, table);
  st = ~tz::crc32c_update(st, f.data() + 32, (size_t)(prefix - 32), table);
  memcpy(f.data() + 28, &st, 4);
  return true;
}

void check_frame(const uint8_t* data, size_t size);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check_frame(data, size);
  std::vector<uint8_t> fixed(data, data + size);
  if (fix_header_crc(fixed) && memcmp(fixed.data() + 28, data + 28, 4) != 0) check_frame(fixed.data(), fixed.size());
  return 0;
}

namespace {

void check_frame(const uint8_t* data, size_t size) {
  static tz_ctx* ctx = tz_ctx_create(2);

  const size_t pre = tz_frame_prefix_size(data, size);
  tz_frame_info info{};
  const size_t ins = tz_frame_inspect(data, size, &info);
  if (tz_is_error(ins)) {
    // Nothing past the header parser may accept what the inspector rejects.
    FUZZ_CHECK(tz_is_error(tz_verify(data, size, 1, nullptr)));
    uint8_t small[256];
    FUZZ_CHECK(tz_is_error(tz_decompress(small, sizeof small, data, size, 1)));
    return;
  }
  FUZZ_CHECK(!tz_is_error(pre) && pre == ins);
  FUZZ_CHECK(info.prefix_size == ins && ins <= size);
  FUZZ_CHECK(info.frame_size == 0 || (info.frame_size >= ins && info.frame_size <= size));
  FUZZ_CHECK(info.n_streams >= 1 && info.n_streams <= 4);
  FUZZ_CHECK((unsigned)info.dtype <= TZ_DTYPE_F8_E5M2);
  if (info.raw_size > kMaxRaw) return;

  unsigned bad = UINT_MAX;
  const size_t v = tz_verify(data, size, 1, &bad);
  std::vector<uint8_t> out((size_t)info.raw_size + 1);
  const size_t d = tz_decompress(out.data(), (size_t)info.raw_size, data, size, 1);
  // Verify and decompress accept exactly the same inputs.
  FUZZ_CHECK(tz_is_error(v) == tz_is_error(d));
  if (tz_is_error(d)) {
    if (tz_get_error_code(v) >= TZ_ERROR_CORRUPT_BLOCK && tz_get_error_code(v) <= TZ_ERROR_CHECKSUM &&
        bad != UINT_MAX)
      FUZZ_CHECK(bad < info.n_blocks);
    return;
  }
  FUZZ_CHECK(d == info.raw_size && v == d);
  FUZZ_CHECK(info.frame_size == size);

  // The context (two workers) decodes the same bytes.
  std::vector<uint8_t> out2((size_t)info.raw_size + 1);
  FUZZ_CHECK(tz_ctx_decompress(ctx, out2.data(), (size_t)info.raw_size, data, size) == d);
  FUZZ_CHECK(memcmp(out.data(), out2.data(), d) == 0);

  // Random access from a separate copy of the prefix: each block alone,
  // then all blocks at once.
  const std::vector<uint8_t> prefix(data, data + ins);
  const unsigned n = info.n_blocks < 64 ? info.n_blocks : 64;
  for (unsigned b = 0; b <= n; ++b) {
    const unsigned first = b < n ? b : 0, count = b < n ? 1 : info.n_blocks;
    uint64_t off = 0, bsize = 0, roff = 0, rsize = 0;
    FUZZ_CHECK(tz_frame_block_range(prefix.data(), prefix.size(), first, count, &off, &bsize, &roff, &rsize) == 0);
    FUZZ_CHECK(off >= ins && off + bsize <= size && roff + rsize <= d);
    const std::vector<uint8_t> blocks(data + off, data + off + bsize);
    std::vector<uint8_t> part((size_t)rsize + 1);
    const size_t r = tz_decompress_blocks(part.data(), (size_t)rsize, prefix.data(), prefix.size(), blocks.data(),
                                          blocks.size(), first, count, 1);
    FUZZ_CHECK(r == rsize);
    FUZZ_CHECK(rsize == 0 || memcmp(part.data(), out.data() + roff, (size_t)rsize) == 0);
  }
}

}  // namespace

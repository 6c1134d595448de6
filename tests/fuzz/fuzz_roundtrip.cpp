// Round-trip fuzz target: the input (after one control byte that picks the
// level and block size) is compressed as every dtype. Invariants: compression
// never fails on valid parameters, stays within tz_compress_bound, decodes to
// the input bit for bit, and gives identical bytes on a second call and with
// a multi-threaded context.
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "tensorzip/tensorzip.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tz_ctx* ctx = tz_ctx_create(3);
  if (size < 1) return 0;
  const uint8_t ctl = data[0];
  ++data;
  --size;
  const tz_dtype dtypes[] = {TZ_DTYPE_BYTES, TZ_DTYPE_BF16, TZ_DTYPE_F16,
                             TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3, TZ_DTYPE_F8_E5M2};
  const size_t bound = tz_compress_bound(size);
  std::vector<uint8_t> c1(bound), c2(bound), c3(bound), out(size + 1);
  for (tz_dtype dt : dtypes) {
    tz_params p{};
    p.dtype = dt;
    p.level = (int)(ctl % 5) - 1;
    p.block_elems = 4096u << ((ctl >> 3) & 3);
    p.threads = 1;
    const size_t r1 = tz_compress(c1.data(), c1.size(), data, size, &p);
    FUZZ_CHECK(!tz_is_error(r1) && r1 <= bound);
    const size_t r2 = tz_compress(c2.data(), c2.size(), data, size, &p);
    FUZZ_CHECK(r2 == r1 && memcmp(c1.data(), c2.data(), r1) == 0);
    const size_t r3 = tz_ctx_compress(ctx, c3.data(), c3.size(), data, size, &p);
    FUZZ_CHECK(r3 == r1 && memcmp(c1.data(), c3.data(), r1) == 0);

    tz_frame_info info{};
    FUZZ_CHECK(!tz_is_error(tz_frame_inspect(c1.data(), r1, &info)));
    FUZZ_CHECK(info.raw_size == size && info.frame_size == r1);
    const size_t es = dt == TZ_DTYPE_F32 ? 4 : (dt == TZ_DTYPE_BF16 || dt == TZ_DTYPE_F16) ? 2 : 1;
    FUZZ_CHECK(info.dtype == (size % es == 0 ? dt : TZ_DTYPE_BYTES));

    out[size] = 0xA5;
    const size_t d = tz_decompress(out.data(), size, c1.data(), r1, 1);
    FUZZ_CHECK(d == size);
    FUZZ_CHECK(size == 0 || memcmp(out.data(), data, size) == 0);
    FUZZ_CHECK(out[size] == 0xA5);
    FUZZ_CHECK(tz_ctx_decompress(ctx, out.data(), size, c1.data(), r1) == size);
    FUZZ_CHECK(size == 0 || memcmp(out.data(), data, size) == 0);
  }
  return 0;
}

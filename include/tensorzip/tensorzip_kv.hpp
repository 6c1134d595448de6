// Thin C++ wrapper over the KV page codec's C ABI (tensorzip_kv.h): an RAII
// codec, exceptions (tensorzip::Error) instead of error codes, spans and
// vectors. Header-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tensorzip/tensorzip.hpp"
#include "tensorzip/tensorzip_kv.h"

namespace tensorzip::kv {

struct Params {
  tz_kv_mode mode = TZ_KV_MODE_RANS;
  unsigned fixed_bits = 0;  // fixed mode: 0 = from the sample
  bool checksum = true;
  std::vector<uint32_t> row_dims;  // optional page row shape, e.g. {heads, head_dim}
  tz_kv_params c() const {
    tz_kv_params p{};
    p.mode = mode;
    p.fixed_bits = fixed_bits;
    p.no_checksum = checksum ? 0 : 1;
    if (row_dims.size() > TZ_KV_MAX_ROW_DIMS) throw Error(TZ_ERROR_BAD_PARAMETER, "at most 4 row dims");
    p.n_row_dims = (unsigned)row_dims.size();
    for (size_t i = 0; i < row_dims.size(); ++i) p.row_dims[i] = row_dims[i];
    return p;
  }
};

// Calibrated tables plus everything derived from them; immutable, shareable
// between threads.
class PageCodec {
 public:
  static PageCodec calibrate(std::span<const uint8_t> sample, DType dtype, const Params& p = {}) {
    tz_kv_codec* c = nullptr;
    const tz_kv_params cp = p.c();
    detail::check(tz_kv_calibrate(&c, sample.data(), sample.size(), static_cast<tz_dtype>(dtype), &cp));
    return PageCodec(c);
  }
  static PageCodec load(std::span<const uint8_t> tables) {
    tz_kv_codec* c = nullptr;
    detail::check(tz_kv_codec_load(&c, tables.data(), tables.size()));
    return PageCodec(c);
  }
  std::vector<uint8_t> tables() const {
    std::vector<uint8_t> out(detail::check(tz_kv_codec_tables(get(), nullptr, 0)));
    detail::check(tz_kv_codec_tables(get(), out.data(), out.size()));
    return out;
  }
  tz_kv_codec_info info() const {
    tz_kv_codec_info i{};
    detail::check(tz_kv_codec_get_info(get(), &i));
    return i;
  }
  size_t bound(size_t page_bytes) const { return detail::check(tz_kv_page_bound(get(), page_bytes)); }

  std::vector<uint8_t> encode(std::span<const uint8_t> page) const {
    std::vector<uint8_t> out(bound(page.size()));
    out.resize(detail::check(tz_kv_encode(get(), out.data(), out.size(), page.data(), page.size())));
    return out;
  }
  size_t decoded_size(std::span<const uint8_t> page) const {
    return detail::check(tz_kv_page_decoded_size(get(), page.data(), page.size()));
  }
  std::vector<uint8_t> decode(std::span<const uint8_t> page) const {
    std::vector<uint8_t> out(decoded_size(page));
    detail::check(tz_kv_decode(get(), out.data(), out.size(), page.data(), page.size()));
    return out;
  }
  // Batches: items' results filled; throws for the first failed item.
  void encode_batch(std::span<tz_kv_item> items, unsigned threads = 0) const {
    detail::check(tz_kv_encode_batch(get(), items.data(), items.size(), threads));
  }
  void decode_batch(std::span<tz_kv_item> items, unsigned threads = 0) const {
    detail::check(tz_kv_decode_batch(get(), items.data(), items.size(), threads));
  }

  const tz_kv_codec* get() const { return c_.get(); }

 private:
  struct Free {
    void operator()(tz_kv_codec* c) const { tz_kv_codec_free(c); }
  };
  explicit PageCodec(tz_kv_codec* c) : c_(c) {}
  std::unique_ptr<tz_kv_codec, Free> c_;
};

}  // namespace tensorzip::kv

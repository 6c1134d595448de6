// C ABI of the KV page codec (include/tensorzip/tensorzip_kv.h). No exception
// crosses it: every entry point converts to an error code.
#include <new>
#include <string>

#include "cpu/frame.h"
#include "kv/codec.hpp"

struct tz_kv_codec_s {
  std::unique_ptr<tz::kv::Codec> c;
};

namespace tz::kv {
const Codec* codec_of(const tz_kv_codec* c) { return c ? c->c.get() : nullptr; }
}  // namespace tz::kv

namespace {

using tz::cpu::guarded;
using tz::cpu::make_error;

size_t no_codec() { return make_error(TZ_ERROR_BAD_PARAMETER, "KV: null codec"); }

size_t wrap(tz_kv_codec** out, size_t r, std::unique_ptr<tz::kv::Codec> c) {
  if (tz::cpu::is_error(r)) return r;
  *out = new tz_kv_codec_s{std::move(c)};
  return 0;
}

}  // namespace

extern "C" {

size_t tz_kv_calibrate(tz_kv_codec** out, const void* sample, size_t sample_size, tz_dtype dtype,
                       const tz_kv_params* params) {
  return guarded([&]() -> size_t {
    if (!out) return make_error(TZ_ERROR_BAD_PARAMETER, "KV calibration: null output pointer");
    *out = nullptr;
    const tz_kv_params p = params ? *params : tz_kv_params{};
    std::unique_ptr<tz::kv::Codec> c;
    const size_t r = tz::kv::Codec::calibrate(&c, (const uint8_t*)sample, sample_size, (uint8_t)dtype, p);
    return wrap(out, r, std::move(c));
  });
}

size_t tz_kv_codec_load(tz_kv_codec** out, const void* tables, size_t tables_size) {
  return guarded([&]() -> size_t {
    if (!out) return make_error(TZ_ERROR_BAD_PARAMETER, "KV tables: null output pointer");
    *out = nullptr;
    std::unique_ptr<tz::kv::Codec> c;
    const size_t r = tz::kv::Codec::load(&c, (const uint8_t*)tables, tables_size);
    return wrap(out, r, std::move(c));
  });
}

size_t tz_kv_codec_tables(const tz_kv_codec* codec, void* dst, size_t dst_capacity) {
  if (!codec) return no_codec();
  const auto& b = codec->c->blob();
  if (!dst) return b.size();
  if (dst_capacity < b.size())
    return make_error(TZ_ERROR_DST_TOO_SMALL, "KV tables: " + std::to_string(b.size()) + " bytes needed");
  memcpy(dst, b.data(), b.size());
  return b.size();
}

void tz_kv_codec_free(tz_kv_codec* codec) { delete codec; }

size_t tz_kv_codec_get_info(const tz_kv_codec* codec, tz_kv_codec_info* info) {
  if (!codec) return no_codec();
  if (!info) return make_error(TZ_ERROR_BAD_PARAMETER, "KV: null info");
  const tz::kv::KvTables& t = codec->c->tables().t;
  *info = tz_kv_codec_info{};
  info->dtype = (tz_dtype)t.dtype;
  info->mode = t.mode == tz::kv::kModeFixedTables ? TZ_KV_MODE_FIXED : TZ_KV_MODE_RANS;
  info->fixed_bits = t.fixed_bits;
  info->checksum = (t.flags & tz::kv::kFlagChecksum) ? 1u : 0u;
  info->table_id = t.id;
  for (int k = 0; k < t.n_streams; ++k) info->stream_coded[k] = t.st[k].kind == tz::kKindRans;
  info->n_row_dims = t.n_row_dims;
  for (int d = 0; d < t.n_row_dims; ++d) info->row_dims[d] = t.row_dims[d];
  return 0;
}

size_t tz_kv_page_bound(const tz_kv_codec* codec, size_t page_bytes) {
  if (!codec) return no_codec();
  return codec->c->page_bound(page_bytes);
}

size_t tz_kv_encode(const tz_kv_codec* codec, void* dst, size_t dst_capacity, const void* src, size_t src_size) {
  if (!codec) return no_codec();
  return guarded([&] {
    return codec->c->encode(tz::kv::active_page_kernels(), (uint8_t*)dst, dst_capacity, (const uint8_t*)src,
                            src_size);
  });
}

size_t tz_kv_page_decoded_size(const tz_kv_codec* codec, const void* page, size_t page_size) {
  if (!codec) return no_codec();
  return codec->c->decoded_size((const uint8_t*)page, page_size);
}

size_t tz_kv_decode(const tz_kv_codec* codec, void* dst, size_t dst_capacity, const void* src, size_t src_size) {
  if (!codec) return no_codec();
  return guarded([&] {
    return codec->c->decode(tz::kv::active_page_kernels(), (uint8_t*)dst, dst_capacity, (const uint8_t*)src,
                            src_size);
  });
}

size_t tz_kv_encode_batch(const tz_kv_codec* codec, tz_kv_item* items, size_t n_items, unsigned threads) {
  if (!codec) return no_codec();
  return guarded([&] { return codec->c->encode_batch(tz::kv::active_page_kernels(), items, n_items, threads); });
}

size_t tz_kv_decode_batch(const tz_kv_codec* codec, tz_kv_item* items, size_t n_items, unsigned threads) {
  if (!codec) return no_codec();
  return guarded([&] { return codec->c->decode_batch(tz::kv::active_page_kernels(), items, n_items, threads); });
}

}  // extern "C"

// C ABI over the CPU backend. No exception crosses this boundary: every
// entry point catches and converts to an error code.
#include <algorithm>
#include <new>

#include "cpu/frame.h"
#include "cpu/kernels.h"
#include "cpu/simd_path.h"
#include "tensorzip/tensorzip.h"

using tz::cpu::make_error;

struct tz_ctx_s {
  tz::cpu::ContextPtr ctx;
};

namespace {

using tz::cpu::guarded;

tz::cpu::Context& one_shot(unsigned threads, tz::cpu::ContextPtr& holder) {
  holder = tz::cpu::make_context(threads);
  return *holder;
}

tz_params default_params() {
  tz_params p{};
  p.dtype = TZ_DTYPE_BYTES;
  return p;
}

}  // namespace

extern "C" {

unsigned tz_is_error(size_t code) { return tz::cpu::is_error(code) ? 1u : 0u; }

tz_error_code tz_get_error_code(size_t code) {
  return tz::cpu::is_error(code) ? (tz_error_code)(0 - code) : TZ_OK;
}

const char* tz_error_code_name(tz_error_code code) {
  switch (code) {
    case TZ_OK: return "no error";
    case TZ_ERROR_GENERIC: return "error";
    case TZ_ERROR_DST_TOO_SMALL: return "destination buffer too small";
    case TZ_ERROR_SRC_TRUNCATED: return "input truncated";
    case TZ_ERROR_BAD_MAGIC: return "not a tensorzip frame";
    case TZ_ERROR_BAD_VERSION: return "unsupported format version";
    case TZ_ERROR_CORRUPT_HEADER: return "corrupt frame header";
    case TZ_ERROR_CORRUPT_BLOCK: return "corrupt block";
    case TZ_ERROR_CHECKSUM: return "checksum mismatch";
    case TZ_ERROR_BAD_PARAMETER: return "bad parameter";
    case TZ_ERROR_UNSUPPORTED: return "unsupported";
    case TZ_ERROR_ALLOCATION: return "allocation failed";
    default: return "unknown error code";
  }
}

const char* tz_get_error_name(size_t code) { return tz_error_code_name(tz_get_error_code(code)); }

const char* tz_last_error_detail(void) { return tz::cpu::last_error_detail().c_str(); }

const char* tz_dtype_name(tz_dtype d) {
  const char* n = (unsigned)d < tz::kDTypeCount ? tz::dtype_name((uint8_t)d) : nullptr;
  return n ? n : "unknown";
}

const char* tz_simd_path(void) { return tz::cpu::simd_path_name(tz::cpu::active_simd_path()); }

const char* tz_simd_kernels(void) { return tz::cpu::codec_kernels_name(tz::cpu::codec_kernels()); }

int tz_set_simd_path(const char* name) {
  tz::cpu::SimdPath p;
  if (!name || !tz::cpu::parse_simd_path(name, &p)) return -1;
  return tz::cpu::set_active_simd_path(p) ? 0 : -1;
}

unsigned tz_version_number(void) {
  return TZ_VERSION_MAJOR * 10000 + TZ_VERSION_MINOR * 100 + TZ_VERSION_PATCH;
}

size_t tz_compress_bound(size_t n) { return tz::cpu::compress_bound(n); }

size_t tz_compress(void* dst, size_t cap, const void* src, size_t n, const tz_params* params) {
  return guarded([&] {
    tz::cpu::ContextPtr h;
    const tz_params p = params ? *params : default_params();
    return tz::cpu::compress_frame(one_shot(p.threads, h), (uint8_t*)dst, cap, (const uint8_t*)src, n, p);
  });
}

size_t tz_decompress(void* dst, size_t cap, const void* src, size_t n, unsigned threads) {
  return guarded([&] {
    tz::cpu::ContextPtr h;
    return tz::cpu::decompress_frame(one_shot(threads, h), (uint8_t*)dst, cap, (const uint8_t*)src, n, true,
                                     nullptr);
  });
}

size_t tz_verify(const void* src, size_t n, unsigned threads, unsigned* bad_block) {
  return guarded([&] {
    tz::cpu::ContextPtr h;
    return tz::cpu::decompress_frame(one_shot(threads, h), nullptr, 0, (const uint8_t*)src, n, false, bad_block);
  });
}

size_t tz_frame_prefix_size(const void* src, size_t n) {
  return guarded([&]() -> size_t {
    tz::FrameHeader h;
    const int st = tz::parse_frame_header((const uint8_t*)src, n, &h);
    if (st != tz::kOk) return make_error(st, "cannot parse frame header");
    return (size_t)tz::frame_prefix_size(h);
  });
}

size_t tz_frame_inspect(const void* src, size_t n, tz_frame_info* info) {
  return guarded([&]() -> size_t {
    if (!info) return make_error(TZ_ERROR_BAD_PARAMETER, "info is null");
    tz::cpu::FramePrefix fp;
    const size_t pr = tz::cpu::parse_prefix((const uint8_t*)src, n, &fp);
    if (tz_is_error(pr)) return pr;
    *info = tz_frame_info{};
    info->format_version = fp.h.version;
    info->dtype = (tz_dtype)fp.h.dtype;
    info->n_streams = fp.h.n_streams;
    info->block_elems = fp.h.block_elems;
    info->n_blocks = fp.h.n_blocks;
    info->raw_size = fp.h.raw_size;
    info->prefix_size = pr;
    const uint64_t frame = pr + fp.blocks_size;
    info->frame_size = n >= frame ? frame : 0;
    for (int k = 0; k < fp.h.n_streams; ++k) info->stream_kind[k] = fp.t.kind[k];
    return pr;
  });
}

size_t tz_frame_block_range(const void* prefix, size_t prefix_size, unsigned first, unsigned count,
                            uint64_t* offset, uint64_t* size, uint64_t* raw_offset, uint64_t* raw_size) {
  return guarded([&]() -> size_t {
    tz::cpu::FramePrefix fp;
    const size_t pr = tz::cpu::parse_prefix((const uint8_t*)prefix, prefix_size, &fp);
    if (tz_is_error(pr)) return pr;
    if ((uint64_t)first + count > fp.h.n_blocks)
      return make_error(TZ_ERROR_BAD_PARAMETER, "block range outside the frame");
    uint64_t off = pr, sz = 0;
    for (unsigned b = 0; b < first; ++b) off += tz::load_le32(fp.index + 4ull * b);
    for (unsigned b = first; b < first + count; ++b) sz += tz::load_le32(fp.index + 4ull * b);
    const uint32_t es = tz::dtype_elem_size(fp.h.dtype);
    uint64_t roff = std::min<uint64_t>((uint64_t)first * fp.h.block_elems * es, fp.h.raw_size), rsz = 0;
    for (unsigned b = first; b < first + count; ++b) rsz += (uint64_t)tz::block_elem_count(fp.h, b) * es;
    if (offset) *offset = off;
    if (size) *size = sz;
    if (raw_offset) *raw_offset = roff;
    if (raw_size) *raw_size = rsz;
    return 0;
  });
}

size_t tz_decompress_blocks(void* dst, size_t cap, const void* prefix, size_t prefix_size, const void* blocks,
                            size_t blocks_size, unsigned first, unsigned count, unsigned threads) {
  return guarded([&] {
    tz::cpu::ContextPtr h;
    return tz::cpu::decompress_blocks(one_shot(threads, h), (uint8_t*)dst, cap, (const uint8_t*)prefix,
                                      prefix_size, (const uint8_t*)blocks, blocks_size, first, count, nullptr);
  });
}

tz_ctx* tz_ctx_create(unsigned threads) {
  try {
    auto* c = new tz_ctx_s;
    c->ctx = tz::cpu::make_context(threads);
    return c;
  } catch (...) {
    return nullptr;
  }
}

void tz_ctx_free(tz_ctx* ctx) { delete ctx; }

unsigned tz_ctx_threads(const tz_ctx* ctx) { return ctx ? tz::cpu::context_threads(*ctx->ctx) : 0; }

size_t tz_ctx_compress(tz_ctx* ctx, void* dst, size_t cap, const void* src, size_t n, const tz_params* params) {
  if (!ctx) return make_error(TZ_ERROR_BAD_PARAMETER, "context is null");
  return guarded([&] {
    const tz_params p = params ? *params : default_params();
    return tz::cpu::compress_frame(*ctx->ctx, (uint8_t*)dst, cap, (const uint8_t*)src, n, p);
  });
}

size_t tz_ctx_decompress(tz_ctx* ctx, void* dst, size_t cap, const void* src, size_t n) {
  if (!ctx) return make_error(TZ_ERROR_BAD_PARAMETER, "context is null");
  return guarded([&] {
    return tz::cpu::decompress_frame(*ctx->ctx, (uint8_t*)dst, cap, (const uint8_t*)src, n, true, nullptr);
  });
}

size_t tz_ctx_decompress_blocks(tz_ctx* ctx, void* dst, size_t cap, const void* prefix, size_t prefix_size,
                                const void* blocks, size_t blocks_size, unsigned first, unsigned count) {
  if (!ctx) return make_error(TZ_ERROR_BAD_PARAMETER, "context is null");
  return guarded([&] {
    return tz::cpu::decompress_blocks(*ctx->ctx, (uint8_t*)dst, cap, (const uint8_t*)prefix, prefix_size,
                                      (const uint8_t*)blocks, blocks_size, first, count, nullptr);
  });
}

size_t tz_ctx_decompress_blocks_ex(tz_ctx* ctx, void* dst, size_t cap, const void* prefix, size_t prefix_size,
                                   const void* blocks, size_t blocks_size, unsigned first, unsigned count,
                                   unsigned* bad_block) {
  if (!ctx) return make_error(TZ_ERROR_BAD_PARAMETER, "context is null");
  return guarded([&] {
    return tz::cpu::decompress_blocks(*ctx->ctx, (uint8_t*)dst, cap, (const uint8_t*)prefix, prefix_size,
                                      (const uint8_t*)blocks, blocks_size, first, count, bad_block);
  });
}

size_t tz_ctx_verify(tz_ctx* ctx, const void* src, size_t n, unsigned* bad_block) {
  if (!ctx) return make_error(TZ_ERROR_BAD_PARAMETER, "context is null");
  return guarded([&] {
    return tz::cpu::decompress_frame(*ctx->ctx, nullptr, 0, (const uint8_t*)src, n, false, bad_block);
  });
}

}  // extern "C"

// The portable kernel table's rANS coder: scalar C++ for any CPU, giving
// exactly the bytes and statuses of tz::rans_encode_ctx / tz::rans_decode_ctx
// (src/codec/rans.h, the reference shared with CUDA), laid out for a
// superscalar core rather than for a GPU thread.
#pragma once
#include <cstddef>
#include <cstdint>

#include "codec/rans.h"

namespace tz::cpu {

// As tz::rans_encode_ctx(sym, n, enc, ctx, words, out, limit).
size_t rans_encode_portable(const uint8_t* sym, uint32_t n, const RansEncSym* enc, const RansCtx& ctx,
                            uint16_t* words, uint8_t* out, size_t limit);
// As tz::rans_decode_ctx(in, size, n, dec, ctx, out).
int rans_decode_portable(const uint8_t* in, size_t size, uint32_t n, const uint32_t* dec, const RansCtx& ctx,
                         uint8_t* out);

}  // namespace tz::cpu

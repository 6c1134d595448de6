// Thin C++ wrapper over the C ABI (tensorzip.h): RAII context, exceptions
// instead of error codes, std::vector/std::span buffers. Header-only; adds no
// symbols to the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensorzip/tensorzip.h"

namespace tensorzip {

enum class DType : int {
  Bytes = TZ_DTYPE_BYTES,
  BF16 = TZ_DTYPE_BF16,
  F16 = TZ_DTYPE_F16,
  F32 = TZ_DTYPE_F32,
  F8E4M3 = TZ_DTYPE_F8_E4M3,
  F8E5M2 = TZ_DTYPE_F8_E5M2,
};

// Thrown for every failed call; code() is the C error code.
class Error : public std::runtime_error {
 public:
  Error(tz_error_code code, const std::string& what) : std::runtime_error(what), code_(code) {}
  tz_error_code code() const noexcept { return code_; }

 private:
  tz_error_code code_;
};

namespace detail {
inline size_t check(size_t r) {
  if (tz_is_error(r)) {
    std::string msg = tz_get_error_name(r);
    const char* d = tz_last_error_detail();
    if (d && *d) msg += std::string(": ") + d;
    throw Error(tz_get_error_code(r), msg);
  }
  return r;
}
}  // namespace detail

struct Params {
  DType dtype = DType::Bytes;
  int level = 0;            // 0 = default; see tz_params
  unsigned block_elems = 0;  // 0 = default
  tz_params c(unsigned threads = 0) const {
    tz_params p{};
    p.dtype = static_cast<tz_dtype>(dtype);
    p.level = level;
    p.block_elems = block_elems;
    p.threads = threads;
    return p;
  }
};

struct FrameInfo {
  DType dtype;
  uint64_t raw_size;
  uint64_t frame_size;
  uint64_t prefix_size;
  unsigned block_elems;
  unsigned n_blocks;
  unsigned n_streams;
  uint8_t stream_kind[4];
};

inline FrameInfo inspect(std::span<const uint8_t> frame) {
  tz_frame_info i{};
  detail::check(tz_frame_inspect(frame.data(), frame.size(), &i));
  FrameInfo f{static_cast<DType>(i.dtype), i.raw_size, i.frame_size, i.prefix_size, i.block_elems,
              i.n_blocks, i.n_streams, {}};
  for (int k = 0; k < 4; ++k) f.stream_kind[k] = i.stream_kind[k];
  return f;
}

// A thread pool plus scratch memory, reused across calls. Not thread-safe.
class Context {
 public:
  explicit Context(unsigned threads = 0) : ctx_(tz_ctx_create(threads), &tz_ctx_free) {
    if (!ctx_) throw Error(TZ_ERROR_ALLOCATION, "cannot create tensorzip context");
  }
  unsigned threads() const { return tz_ctx_threads(ctx_.get()); }

  std::vector<uint8_t> compress(std::span<const uint8_t> src, const Params& params = {}) {
    std::vector<uint8_t> out(tz_compress_bound(src.size()));
    const tz_params p = params.c();
    out.resize(detail::check(tz_ctx_compress(ctx_.get(), out.data(), out.size(), src.data(), src.size(), &p)));
    return out;
  }

  // Decompresses into dst, which must hold the frame's raw size.
  size_t decompress(std::span<const uint8_t> frame, std::span<uint8_t> dst) {
    return detail::check(tz_ctx_decompress(ctx_.get(), dst.data(), dst.size(), frame.data(), frame.size()));
  }

  std::vector<uint8_t> decompress(std::span<const uint8_t> frame) {
    std::vector<uint8_t> out(inspect(frame).raw_size);
    decompress(frame, out);
    return out;
  }

  // Throws naming the first corrupt block.
  void verify(std::span<const uint8_t> frame) {
    unsigned bad = 0;
    detail::check(tz_ctx_verify(ctx_.get(), frame.data(), frame.size(), &bad));
  }

  tz_ctx* get() { return ctx_.get(); }

 private:
  std::unique_ptr<tz_ctx, void (*)(tz_ctx*)> ctx_;
};

inline std::vector<uint8_t> compress(std::span<const uint8_t> src, const Params& params = {}, unsigned threads = 0) {
  Context c(threads);
  return c.compress(src, params);
}

inline std::vector<uint8_t> decompress(std::span<const uint8_t> frame, unsigned threads = 0) {
  Context c(threads);
  return c.decompress(frame);
}

}  // namespace tensorzip

// CPU backend: whole-frame compression and decompression over a thread pool.
// Errors are returned as size_t error codes (see tensorzip.h) and described
// in a thread-local detail string.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codec/frame_prefix.h"
#include "cpu/thread_pool.h"
#include "tensorzip/tensorzip.h"

namespace tz::cpu {

size_t make_error(int code, std::string detail);
const std::string& last_error_detail();
inline bool is_error(size_t r) { return r > (size_t)-TZ_ERROR_MAX_CODE; }

// Parsed frame prefix: header, per-stream kinds and frequencies, block index
// (codec/frame_prefix.h, the validator shared with the CUDA decoder).
using FramePrefix = FramePrefixView;

// Parses and validates the prefix (header CRC and block index included) with
// parse_frame_prefix. Returns the prefix size or an error.
size_t parse_prefix(const uint8_t* src, size_t n, FramePrefix* fp);

struct Context;
struct ContextDeleter {
  void operator()(Context* c) const;
};
using ContextPtr = std::unique_ptr<Context, ContextDeleter>;
ContextPtr make_context(unsigned threads);
unsigned context_threads(const Context&);

size_t compress_frame(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* src, size_t n, const tz_params& p);
size_t decompress_frame(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* src, size_t n, bool write,
                        unsigned* bad_block);
size_t decompress_blocks(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* prefix, size_t prefix_size,
                         const uint8_t* blocks, size_t blocks_size, uint32_t first, uint32_t count,
                         unsigned* bad_block);

size_t compress_bound(size_t n);

}  // namespace tz::cpu

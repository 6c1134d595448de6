// CPU backend: whole-frame compression and decompression over a thread pool.
// Errors are returned as size_t error codes (see tensorzip.h) and described
// in a thread-local detail string.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "codec/frame_prefix.h"
#include "common/thread_pool.h"
#include "tensorzip/tensorzip.h"

namespace tz::cpu {

size_t make_error(int code, std::string detail);
const std::string& last_error_detail();
inline bool is_error(size_t r) { return r > (size_t)-TZ_ERROR_MAX_CODE; }

// f() (a size or an error) with no exception escaping: what every C entry
// point runs its body in. Out of memory, a thread that could not start and
// any other exception become error codes with a detail.
template <class F>
size_t guarded(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {  // here or in a pool task (ThreadPool rethrows on the caller)
    return make_error(TZ_ERROR_ALLOCATION, "out of memory");
  } catch (const std::system_error& e) {  // a worker thread could not start
    return make_error(e.code() == std::errc::resource_unavailable_try_again ? TZ_ERROR_ALLOCATION : TZ_ERROR_GENERIC,
                      std::string("cannot start a thread: ") + e.what());
  } catch (const std::exception& e) {
    return make_error(TZ_ERROR_GENERIC, e.what());
  } catch (...) {
    return make_error(TZ_ERROR_GENERIC, "unknown error");
  }
}

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
// Whether compress_frame writes seeded lane states (doc/format.md 5.8) where
// a frame can have them (encoder_frame_flags, codec/block.h): on by default.
// Off, it writes the version-3 frames of before (flags 0), for the tests
// that check those still decode. Process-wide.
void set_encoder_seeded_lanes(bool on);
// The flags compress_frame may write (encoder_block_flags & mask; default
// every known flag): kFlagSeededLanes alone writes the seeded frames of
// before self-seeded streams (doc/format.md 5.9); without kFlagZeroElided no
// block elides a stream (5.10). Process-wide.
void set_encoder_flags_mask(uint8_t mask);
size_t decompress_frame(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* src, size_t n, bool write,
                        unsigned* bad_block);
size_t decompress_blocks(Context& ctx, uint8_t* dst, size_t cap, const uint8_t* prefix, size_t prefix_size,
                         const uint8_t* blocks, size_t blocks_size, uint32_t first, uint32_t count,
                         unsigned* bad_block);

// A frame's prefix parsed and validated once (parse_prefix: header CRC,
// tables, block index), with its block index copied and its rANS decode
// tables built from the validated frequencies: a decode of its blocks with
// decompress_blocks_prepared parses nothing and builds no table (resident
// weights, src/resident). Block data is checked as in
// decompress_blocks (block headers, checksums).
struct PreparedFrame;
struct PreparedFrameDeleter {
  void operator()(PreparedFrame* f) const;
};
using PreparedFramePtr = std::unique_ptr<PreparedFrame, PreparedFrameDeleter>;
// Returns the prefix size (and sets *out) or an error.
size_t prepare_frame(const uint8_t* prefix, size_t prefix_size, PreparedFramePtr* out);
// Heap bytes one prepared frame holds (its tables and index copy).
size_t prepared_frame_bytes(const PreparedFrame& f);
// Blocks [first, first + count) of f: their byte range from the frame's start
// (offset, size) and their decoded size; 0 or an error (range outside).
size_t prepared_block_range(const PreparedFrame& f, uint32_t first, uint32_t count, uint64_t* offset,
                            uint64_t* size, uint64_t* raw_size);
// decompress_blocks with the prefix and tables of f.
size_t decompress_blocks_prepared(Context& ctx, const PreparedFrame& f, uint8_t* dst, size_t cap,
                                  const uint8_t* blocks, size_t blocks_size, uint32_t first, uint32_t count,
                                  unsigned* bad_block);

size_t compress_bound(size_t n);

}  // namespace tz::cpu

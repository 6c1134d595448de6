/* tensorzip: lossless compression of floating-point tensors.
 *
 * C ABI. Functions that produce a size return either that size or an error
 * code folded into a size_t (test with tz_is_error, name with
 * tz_get_error_name), as zstd does. No function throws; none keeps a pointer
 * to caller memory after it returns.
 *
 * A compressed buffer is one "frame" (doc/format.md): a header, frequency
 * tables, a block index and independent blocks of a fixed number of
 * elements. Any block can be decoded alone (tz_decompress_blocks).
 */
#ifndef TENSORZIP_H
#define TENSORZIP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TZ_VERSION_MAJOR 0
#define TZ_VERSION_MINOR 1
#define TZ_VERSION_PATCH 0
/* Newest frame format version (doc/format.md): frames of versions 1 to 3
 * decode; the encoder writes 3 when a stream is entropy coded, else 1. */
#define TZ_FORMAT_VERSION 3

/* Element types. Values are stored in frames: never renumber. */
typedef enum {
  TZ_DTYPE_BYTES = 0,    /* any bytes: generic path (zstd or stored) */
  TZ_DTYPE_BF16 = 1,
  TZ_DTYPE_F16 = 2,
  TZ_DTYPE_F32 = 3,
  TZ_DTYPE_F8_E4M3 = 4,
  TZ_DTYPE_F8_E5M2 = 5
} tz_dtype;

typedef enum {
  TZ_OK = 0,
  TZ_ERROR_GENERIC = 1,
  TZ_ERROR_DST_TOO_SMALL = 2,
  TZ_ERROR_SRC_TRUNCATED = 3,
  TZ_ERROR_BAD_MAGIC = 4,
  TZ_ERROR_BAD_VERSION = 5,
  TZ_ERROR_CORRUPT_HEADER = 6,
  TZ_ERROR_CORRUPT_BLOCK = 7,
  TZ_ERROR_CHECKSUM = 8,
  TZ_ERROR_BAD_PARAMETER = 9,
  TZ_ERROR_UNSUPPORTED = 10,
  TZ_ERROR_ALLOCATION = 11,
  TZ_ERROR_MAX_CODE = 12
} tz_error_code;

unsigned tz_is_error(size_t code);
tz_error_code tz_get_error_code(size_t code);
const char* tz_get_error_name(size_t code);
const char* tz_error_code_name(tz_error_code code);
const char* tz_dtype_name(tz_dtype dtype);
unsigned tz_version_number(void); /* MAJOR*10000 + MINOR*100 + PATCH */
/* The CPU kernel set in use: "portable", "avx2", "avx512" or "neon" (the best
 * this CPU and build have, or the one the environment variable TZ_SIMD names).
 * Every path produces the same bytes; only speed differs. */
const char* tz_simd_path(void);
/* The kernel table in use, in words: tz_simd_path()'s name, followed where
 * that path has more than one table (avx512: one for AMD CPUs, one for the
 * others) by which one, e.g. "avx512 (16-lane merged decoders)". For reports
 * (`tzip --version`, the benchmarks); tz_set_simd_path takes the plain name. */
const char* tz_simd_kernels(void);
/* Switches the CPU kernel set at run time, by the name tz_simd_path() gives
 * (benchmarks and tests comparing paths in one process). Returns 0, or -1
 * when the name is unknown or this CPU/build lacks the path (the path in use
 * is then unchanged). Call only while no other thread is coding. */
int tz_set_simd_path(const char* name);

/* Human-readable detail of the last error returned on this thread, e.g.
 * "block 17: checksum mismatch". Empty string if none. */
const char* tz_last_error_detail(void);

/* Compression parameters. Zero-initialise, then set what you need;
 * zero means "default" for every field. */
typedef struct {
  tz_dtype dtype;        /* how to interpret the bytes */
  int level;             /* 0 default (1); 1 fast: code a field only when it saves >= 1%;
                            2 code every field that shrinks; 3 strongest: level 2 plus lane-context
                            tables for the exponent field (frames of format version 2; decoded by the
                            CPU and GPU, encoded by the CPU only) and zstd 19 for bytes;
                            -1 store (no entropy coding) */
  unsigned block_elems;  /* elements per block, power of two in [4096, 2^20]; 0 = 65536
                            (262144 for TZ_DTYPE_BYTES) */
  unsigned threads;      /* 0 = all hardware threads; ignored by tz_ctx_* calls */
} tz_params;

/* Upper bound of the compressed size of src_size bytes of any dtype. */
size_t tz_compress_bound(size_t src_size);

/* Compresses src into dst. If src_size is not a multiple of the element size,
 * the data is compressed through the generic path. Output is identical for
 * every thread count. Returns the frame size or an error. */
size_t tz_compress(void* dst, size_t dst_capacity, const void* src, size_t src_size, const tz_params* params);

/* Decompresses exactly one frame (src_size must be the frame's size) into
 * dst. Every block's checksum is verified. Returns the decompressed size.
 * Untrusted input: a valid frame of a few hundred bytes may decode to many
 * MiB (constant data costs almost nothing), so read raw_size with
 * tz_frame_inspect and apply your own limit before allocating dst. */
size_t tz_decompress(void* dst, size_t dst_capacity, const void* src, size_t src_size, unsigned threads);

/* Frame description, read from the header without decoding. */
typedef struct {
  unsigned format_version;
  tz_dtype dtype;
  unsigned n_streams;
  unsigned block_elems;
  unsigned n_blocks;
  uint64_t raw_size;          /* decompressed bytes */
  uint64_t prefix_size;       /* header + tables + block index */
  uint64_t frame_size;        /* whole frame; 0 if src held only the prefix */
  uint8_t stream_kind[4];     /* 0 stored, 1 rANS, 2 zstd, 3 rANS with lane contexts */
} tz_frame_info;

/* Bytes of the frame needed to call tz_frame_inspect: give it at least 32. */
size_t tz_frame_prefix_size(const void* src, size_t src_size);

/* Parses and checks the header, tables and block index (src_size must cover
 * tz_frame_prefix_size bytes). frame_size is filled when src_size covers it. */
size_t tz_frame_inspect(const void* src, size_t src_size, tz_frame_info* info);

/* Byte range [*offset, *offset + *size) of blocks [first, first+count)
 * relative to the frame start, from the prefix alone. */
size_t tz_frame_block_range(const void* prefix, size_t prefix_size, unsigned first, unsigned count,
                            uint64_t* offset, uint64_t* size, uint64_t* raw_offset, uint64_t* raw_size);

/* Decodes blocks [first, first+count) given the frame prefix and the
 * compressed bytes of exactly those blocks (as located by
 * tz_frame_block_range). Writes their decoded bytes to dst. */
size_t tz_decompress_blocks(void* dst, size_t dst_capacity, const void* prefix, size_t prefix_size,
                            const void* blocks, size_t blocks_size, unsigned first, unsigned count,
                            unsigned threads);

/* Decodes and checks every block without keeping the output. Returns the
 * decompressed size or the first error (with the block in *bad_block). */
size_t tz_verify(const void* src, size_t src_size, unsigned threads, unsigned* bad_block);

/* Reusable context: owns a thread pool and scratch memory, so that many
 * small tensors do not pay thread start-up each time. Not thread-safe:
 * use one per thread. */
typedef struct tz_ctx_s tz_ctx;
tz_ctx* tz_ctx_create(unsigned threads); /* 0 = all hardware threads */
void tz_ctx_free(tz_ctx* ctx);
unsigned tz_ctx_threads(const tz_ctx* ctx);
size_t tz_ctx_compress(tz_ctx* ctx, void* dst, size_t dst_capacity, const void* src, size_t src_size,
                       const tz_params* params);
size_t tz_ctx_decompress(tz_ctx* ctx, void* dst, size_t dst_capacity, const void* src, size_t src_size);
size_t tz_ctx_decompress_blocks(tz_ctx* ctx, void* dst, size_t dst_capacity, const void* prefix,
                                size_t prefix_size, const void* blocks, size_t blocks_size, unsigned first,
                                unsigned count);
/* As tz_ctx_decompress_blocks; on error *bad_block (if non-null) receives
 * the index in the frame of the first block that failed. */
size_t tz_ctx_decompress_blocks_ex(tz_ctx* ctx, void* dst, size_t dst_capacity, const void* prefix,
                                   size_t prefix_size, const void* blocks, size_t blocks_size, unsigned first,
                                   unsigned count, unsigned* bad_block);
/* If bad_block is non-null it receives the first failing block on error. */
size_t tz_ctx_verify(tz_ctx* ctx, const void* src, size_t src_size, unsigned* bad_block);

#ifdef __cplusplus
}
#endif
#endif /* TENSORZIP_H */

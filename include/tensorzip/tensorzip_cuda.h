/* tensorzip CUDA backend: batched compression and decompression of tensors
 * that live in GPU memory.
 *
 * Batch-first (one call handles many tensors, "items"), caller-owned
 * temporary memory with a size query, the CUDA stream last; nothing
 * synchronises the host inside a batch call. Frames are the same format as
 * tz_compress (doc/format.md): a frame encoded here decodes with
 * tz_decompress and vice versa, and for the same input and parameters the
 * GPU frame is byte-identical to the CPU frame (doc/cuda.md).
 *
 * Conventions
 *   - Item descriptors are host arrays; the pointers inside them are device
 *     pointers. The descriptor arrays may be freed as soon as the call
 *     returns (they travel to the GPU as kernel parameters).
 *   - Return value of a batch call: 0, or a size_t error code (tz_is_error)
 *     for call-level problems (null arguments, temp too small, CUDA launch
 *     failure). Per-item results go to two device arrays the caller owns:
 *     d_out_sizes[i] (frame bytes after compression, decoded bytes after
 *     decompression, 0 on error) and d_status[i] (a tz_error_code value).
 *     They are valid once the stream reaches the end of the call.
 *   - A corrupt frame gives a per-item error; the decoder never reads
 *     outside [src, src + src_size) nor writes outside
 *     [dst, dst + dst_capacity) of its item.
 *   - Alignment: compression wants src aligned to the element size and dst
 *     to 4 bytes; decompression wants src aligned to 4 bytes and dst to the
 *     element size (cudaMalloc memory always is). A misaligned item gets
 *     TZ_ERROR_BAD_PARAMETER.
 *   - Not on the GPU: TZ_DTYPE_BYTES and sizes that are not a multiple of
 *     the element size (the CPU encodes those with zstd): compression
 *     reports TZ_ERROR_UNSUPPORTED for such items; decompression of a frame
 *     with a zstd stream reports TZ_ERROR_UNSUPPORTED. Frames whose streams
 *     are stored raw (any dtype, level -1 or incompressible data) decode.
 */
#ifndef TENSORZIP_CUDA_H
#define TENSORZIP_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorzip/tensorzip.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checkpoint-aware coding (doc/container.md section 12, doc/cuda.md): a
 * tensor stored as residual = value XOR prediction, element bit patterns.
 * Decompression returns value = decoded residual XOR prediction (fused into
 * the decode kernel, after each block's checksum, which covers the
 * residual); compression codes value XOR prediction. The prediction is
 *   TZ_CUDA_PREDICT_DELTA: the bytes at src (e.g. the same tensor of the
 *     previous checkpoint): src_size >= the tensor's bytes, any dtype;
 *   TZ_CUDA_PREDICT_CAST: the round-to-nearest-even cast of the FP32 values
 *     at src to the tensor's dtype, which must be BF16 or F16 (src holds
 *     one FP32 per element: src_size >= 2 x the tensor's bytes, 4-aligned).
 * The same per-element functions as the CPU container (src/codec/predict.h),
 * so frames and values match the CPU byte for byte. A zero-initialised
 * prediction (kind 0) means none. src must not overlap the item's dst. */
typedef enum {
  TZ_CUDA_PREDICT_NONE = 0,
  TZ_CUDA_PREDICT_DELTA = 1,
  TZ_CUDA_PREDICT_CAST = 2
} tz_cuda_predict_kind;

typedef struct {
  int kind;         /* tz_cuda_predict_kind */
  const void* src;  /* device: the prediction's source */
  size_t src_size;  /* bytes at src */
} tz_cuda_prediction;

typedef struct {
  const void* src;     /* device: tensor bytes */
  size_t src_size;     /* bytes; a multiple of the element size of dtype */
  tz_dtype dtype;      /* BF16, F16, F32, F8_E4M3 or F8_E5M2 */
  void* dst;           /* device: receives one frame */
  size_t dst_capacity; /* tz_compress_bound(src_size) always suffices */
  tz_cuda_prediction predict; /* optional: code src XOR prediction (temp memory grows by src_size) */
} tz_cuda_compress_item;

typedef struct {
  const void* src;     /* device: exactly one frame */
  size_t src_size;     /* frame bytes */
  void* dst;           /* device: decoded tensor */
  size_t dst_capacity; /* >= the frame's raw size; temp memory grows with it
                          (8 bytes per 4 KiB), so pass the raw size when known */
  tz_cuda_prediction predict; /* optional: dst = decoded residual XOR prediction */
} tz_cuda_decompress_item;

/* Temporary device memory (bytes) needed by tz_cuda_compress for these items
 * and parameters (pointers in items are not read). About the total input
 * size plus 16 KiB per item: blocks are encoded into temp and then packed. */
size_t tz_cuda_compress_temp_size(const tz_cuda_compress_item* items, size_t n_items, const tz_params* params);

/* Compresses every item. params (may be null = defaults) applies to all
 * items: level and block_elems as for tz_compress; threads is ignored.
 * temp must be 256-byte aligned device memory of at least
 * tz_cuda_compress_temp_size bytes; it is in use until the stream passes the
 * end of the call. */
size_t tz_cuda_compress(const tz_cuda_compress_item* items, size_t n_items, const tz_params* params, void* temp,
                        size_t temp_size, size_t* d_out_sizes, int* d_status, cudaStream_t stream);

/* Temporary device memory needed by tz_cuda_decompress (pointers not read). */
size_t tz_cuda_decompress_temp_size(const tz_cuda_decompress_item* items, size_t n_items);

/* Decodes and checksum-verifies every item. On error the item's dst may hold
 * partial output. */
size_t tz_cuda_decompress(const tz_cuda_decompress_item* items, size_t n_items, void* temp, size_t temp_size,
                          size_t* d_out_sizes, int* d_status, cudaStream_t stream);

/* Convenience single-tensor calls: allocate temp memory with cudaMallocAsync
 * on the stream, run the batch call with one item, synchronise the stream and
 * return the frame size (compress) or decoded size (decompress), or an error
 * code. dtype comes from params (null = BF16 is not assumed: params is
 * required for compression). */
size_t tz_cuda_compress_tensor(void* dst, size_t dst_capacity, const void* src, size_t src_size,
                               const tz_params* params, cudaStream_t stream);
size_t tz_cuda_decompress_tensor(void* dst, size_t dst_capacity, const void* src, size_t src_size,
                                 cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* TENSORZIP_CUDA_H */

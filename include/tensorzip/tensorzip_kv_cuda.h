/* tensorzip KV page codec on CUDA devices (doc/kv.md section 7): batches of
 * pages in GPU memory encoded and decoded by one warp per page, producing
 * exactly the bytes of the CPU codec (tz_kv_encode), so a page encoded on
 * either side decodes on the other. Built with the CUDA backend (library
 * tensorzip_kv_cuda).
 *
 * Conventions (as tensorzip_cuda.h): item arrays are host memory, the
 * pointers in them are device pointers; per-item results go to device arrays
 * d_out_sizes (encoded / decoded bytes, 0 on error) and d_status (a
 * tz_error_code), valid once the stream passes the call; the return value
 * reports call-level problems only. Temporary memory is the caller's,
 * 256-byte aligned, sized by the *_temp_size query. Nothing synchronises the
 * host. A damaged page gives its item an error; the decoder never reads
 * outside [src, src + src_size) nor writes outside [dst, dst + dst_capacity).
 */
#ifndef TENSORZIP_KV_CUDA_H
#define TENSORZIP_KV_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "tensorzip/tensorzip_kv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const void* src;     /* device: a page (encode) or an encoded page (decode) */
  size_t src_size;
  void* dst;           /* device */
  size_t dst_capacity; /* encode: >= tz_kv_page_bound; decode: >= the page's decoded size */
} tz_kv_cuda_item;

/* Device memory (bytes) holding one codec's tables for the kernels. */
size_t tz_kv_cuda_tables_size(void);

/* Copies codec's tables to d_tables (device memory of tz_kv_cuda_tables_size
 * bytes) on stream. The codec must stay alive until the copy is done. */
size_t tz_kv_cuda_upload_tables(const tz_kv_codec* codec, void* d_tables, size_t capacity, cudaStream_t stream);

size_t tz_kv_cuda_encode_temp_size(const tz_kv_codec* codec, const tz_kv_cuda_item* items, size_t n_items);
size_t tz_kv_cuda_encode(const tz_kv_codec* codec, const void* d_tables, const tz_kv_cuda_item* items,
                         size_t n_items, void* temp, size_t temp_size, size_t* d_out_sizes, int* d_status,
                         cudaStream_t stream);

/* Decode temp memory grows with dst_capacity (2 bytes per element). */
size_t tz_kv_cuda_decode_temp_size(const tz_kv_codec* codec, const tz_kv_cuda_item* items, size_t n_items);
size_t tz_kv_cuda_decode(const tz_kv_codec* codec, const void* d_tables, const tz_kv_cuda_item* items,
                         size_t n_items, void* temp, size_t temp_size, size_t* d_out_sizes, int* d_status,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* TENSORZIP_KV_CUDA_H */

/* tensorzip KV-cache page codec (doc/kv.md).
 *
 * Lossless coding of KV-cache pages (e.g. 16-256 tokens x heads x head_dim
 * of BF16, FP16 or FP8) with tables calibrated once from a sample and kept
 * apart from the pages: encoding a page builds no histogram and writes no
 * table, and every page decodes on its own given the codec. Values the
 * sample never showed are coded through an escape (never an error).
 *
 * Two modes:
 *   TZ_KV_MODE_RANS   calibrated static rANS (the frame codec's 32-lane
 *                     coder): the best ratio (real BF16 KV: ~1.48x on
 *                     16-token pages, ~1.51x on 256-token pages);
 *   TZ_KV_MODE_FIXED  a fixed-width code for the exponent field with escapes
 *                     (bit planes): lower ratio (~1.43x on BF16), faster.
 *
 * Conventions as in tensorzip.h: functions that produce a size return it or
 * an error code folded into a size_t (tz_is_error, tz_get_error_name,
 * tz_last_error_detail). A codec is immutable once made and may be used by
 * many threads at once. Nothing keeps a pointer to caller memory.
 */
#ifndef TENSORZIP_KV_H
#define TENSORZIP_KV_H

#include <stddef.h>
#include <stdint.h>

#include "tensorzip/tensorzip.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TZ_KV_TABLES_VERSION 1
#define TZ_KV_PAGE_VERSION 1
#define TZ_KV_MAX_PAGE_ELEMS (1u << 26)
#define TZ_KV_MAX_ROW_DIMS 4

typedef enum { TZ_KV_MODE_RANS = 1, TZ_KV_MODE_FIXED = 2 } tz_kv_mode;

/* Calibration parameters. Zero-initialise, then set what you need. */
typedef struct {
  tz_kv_mode mode;          /* 0 = TZ_KV_MODE_RANS */
  unsigned fixed_bits;      /* fixed mode: code width 1..7; 0 = the width that minimises the
                               sample's size */
  int no_checksum;          /* 1: pages carry no CRC32C (faster; corruption of raw bytes then
                               goes unnoticed) */
  unsigned n_row_dims;      /* optional: shape of one token row of a page, e.g. {heads, head_dim},
                               stored with the tables for the bindings (not used by the codec) */
  uint32_t row_dims[TZ_KV_MAX_ROW_DIMS];
} tz_kv_params;

typedef struct tz_kv_codec_s tz_kv_codec;

/* Learns tables from sample (sample_size bytes of dtype BF16, F16, F8_E4M3
 * or F8_E5M2: real pages of the layer / model the codec is for) and makes a
 * codec. Deterministic: the same sample and parameters give the same tables
 * on every machine. Returns 0 or an error; *out is set on success. */
size_t tz_kv_calibrate(tz_kv_codec** out, const void* sample, size_t sample_size, tz_dtype dtype,
                       const tz_kv_params* params);

/* Makes a codec from serialised tables (tz_kv_codec_tables). Every field is
 * checked (doc/kv.md 2.3): tables from an untrusted source are safe. */
size_t tz_kv_codec_load(tz_kv_codec** out, const void* tables, size_t tables_size);

/* Serialised tables (a few hundred bytes). dst = NULL: returns the size only. */
size_t tz_kv_codec_tables(const tz_kv_codec* codec, void* dst, size_t dst_capacity);

void tz_kv_codec_free(tz_kv_codec* codec);

typedef struct {
  tz_dtype dtype;
  tz_kv_mode mode;
  unsigned fixed_bits;            /* fixed mode */
  unsigned checksum;              /* 1 when pages carry a CRC32C */
  uint32_t table_id;              /* CRC32C of the tables; every page records it */
  unsigned stream_coded[2];       /* rANS mode: 1 where field stream k is entropy coded */
  unsigned n_row_dims;
  uint32_t row_dims[TZ_KV_MAX_ROW_DIMS];
} tz_kv_codec_info;

size_t tz_kv_codec_get_info(const tz_kv_codec* codec, tz_kv_codec_info* info);

/* Largest encoded size of a page of page_bytes bytes (a multiple of the
 * element size, at most TZ_KV_MAX_PAGE_ELEMS elements). */
size_t tz_kv_page_bound(const tz_kv_codec* codec, size_t page_bytes);

/* Encodes one page; returns the encoded size. dst_capacity >= tz_kv_page_bound. */
size_t tz_kv_encode(const tz_kv_codec* codec, void* dst, size_t dst_capacity, const void* src, size_t src_size);

/* Decoded size (bytes) of an encoded page, from its 16-byte header. */
size_t tz_kv_page_decoded_size(const tz_kv_codec* codec, const void* page, size_t page_size);

/* Decodes one page; returns its decoded size. The page must have been
 * encoded with this codec's tables (else TZ_ERROR_BAD_PARAMETER); any
 * damage gives an error, never a read or write out of bounds. */
size_t tz_kv_decode(const tz_kv_codec* codec, void* dst, size_t dst_capacity, const void* src, size_t src_size);

/* Batches: one item per page. result receives the item's size (encoded,
 * or decoded) or its error code. threads: 0 = all hardware threads, 1 = the
 * calling thread only. Returns 0 when every item succeeded, else the error
 * code of the first item (lowest index) that failed. */
typedef struct {
  const void* src;
  size_t src_size;
  void* dst;
  size_t dst_capacity;
  size_t result;
} tz_kv_item;

size_t tz_kv_encode_batch(const tz_kv_codec* codec, tz_kv_item* items, size_t n_items, unsigned threads);
size_t tz_kv_decode_batch(const tz_kv_codec* codec, tz_kv_item* items, size_t n_items, unsigned threads);

#ifdef __cplusplus
}
#endif

#endif /* TENSORZIP_KV_H */

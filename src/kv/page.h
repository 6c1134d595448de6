// KV-cache page codec (doc/kv.md, normative): per-page encode and decode with
// tables calibrated once and stored apart from the pages. No allocation, no
// I/O, no threads: the same functions run in a CPU thread and in a GPU warp
// (src/kv/kernels_cuda.cu), and the SIMD kernels of src/kv must produce
// exactly their bytes and statuses.
//
// Two page modes share the field split of the frame format (codec/fields.h):
//   rANS   the coded streams use the calibrated static tables with the
//          32-lane coder of rans.h; a symbol the sample never showed is
//          coded as the table's escape symbol and its byte stored as a
//          literal at the end of the page;
//   fixed  stream 0 becomes a `bits`-wide code per element (code c < 2^bits-1
//          = the c-th calibrated symbol, 2^bits-1 = escape + literal), stored
//          as bit planes of 32 elements; the other streams are stored raw.
// Any page may instead be "stored" (its bytes verbatim) when coding would not
// make it smaller.
//
// This header gathers the three parts: kv_page_format.h (header, bound,
// checksum), kv_page_encode.h (kv_encode_page_with) and kv_page_decode.h
// (the page view, kv_decode_page_with).
#pragma once
#include "kv/page_format.h"
#include "kv/page_encode.h"
#include "kv/page_decode.h"

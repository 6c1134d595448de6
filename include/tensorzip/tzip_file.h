/* tensorzip: .tzip files from C (doc/container.md).
 *
 * A thin C layer over include/tensorzip/container.hpp. Functions return 0 on
 * success or a tzip_status code; tzip_last_error() then holds a one-line
 * message naming the file and the problem (thread-local, valid until the next
 * call on this thread). No function throws. */
#ifndef TENSORZIP_TZIP_FILE_H
#define TENSORZIP_TZIP_FILE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as the tzip exit codes (doc/cli.md). */
typedef enum {
  TZIP_OK = 0,
  TZIP_ERROR_USAGE = 1,        /* bad argument */
  TZIP_ERROR_BAD_INPUT = 2,    /* not the expected format, corrupt, checksum mismatch, differs */
  TZIP_ERROR_IO = 3,           /* missing file, permission, disk full, read/write failure */
  TZIP_ERROR_EXISTS = 4,       /* output exists and force was 0 */
  TZIP_ERROR_INTERNAL = 5,     /* out of memory */
  TZIP_ERROR_INTERRUPTED = 6
} tzip_status;

const char* tzip_last_error(void);

/* safetensors -> .tzip. level and threads as tz_params (0 = defaults). */
int tzip_compress_file(const char* in, const char* out, int level, unsigned threads, int force);
/* .tzip -> the original safetensors file, byte-identical. */
int tzip_decompress_file(const char* in, const char* out, unsigned threads, int force);
/* Checks every checksum; with original != NULL also compares with it. */
int tzip_verify_file(const char* path, const char* original, unsigned threads);

/* Random access: open reads the header only; a read reads that tensor's frames only. */
typedef struct tzip_reader_s tzip_reader;
tzip_reader* tzip_open(const char* path, unsigned threads); /* NULL on error: see tzip_last_error */
void tzip_close(tzip_reader* r);
size_t tzip_tensor_count(const tzip_reader* r);
/* Index of a tensor by name, or -1. */
long tzip_find(const tzip_reader* r, const char* name);
/* Name (valid while r is open), safetensors dtype string, raw byte size. */
const char* tzip_tensor_name(const tzip_reader* r, size_t index);
const char* tzip_tensor_dtype(const tzip_reader* r, size_t index);
uint64_t tzip_tensor_size(const tzip_reader* r, size_t index);
/* Shape: writes up to max_dims dimensions, returns the number of dimensions. */
size_t tzip_tensor_shape(const tzip_reader* r, size_t index, uint64_t* dims, size_t max_dims);
int tzip_read_tensor(tzip_reader* r, size_t index, void* dst, size_t capacity);
/* Bytes [offset, offset+size) of a tensor, decoding only the blocks needed. */
int tzip_read_range(tzip_reader* r, size_t index, uint64_t offset, uint64_t size, void* dst);

#ifdef __cplusplus
}
#endif
#endif /* TENSORZIP_TZIP_FILE_H */

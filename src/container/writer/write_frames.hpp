// TensorWriter's frame stage (writer/write_frames.cpp): the tensors' chunks
// coded in parallel and written in file order through the ordered pipeline
// (common/ordered_pipeline.h), with bounded memory. The rest of the writer
// (tensor table, header, trailer, rename) is in writer/tensor_writer.cpp, its
// prediction discovery in writer/discovery.cpp.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensorzip/container.hpp"
#include "file_io.hpp"

namespace tz::container::detail {

class RefOriginal;  // prediction.hpp

enum class WriterSource { kHost, kFrames, kEncoder };

// Where raw bytes the writer codes itself are: host memory (TensorWriter::add)
// or a range of a file (compress_file's safetensors input, or another file
// of the same checkpoint holding a cast source).
struct ByteSource {
  const uint8_t* data = nullptr;  // host memory, or
  const InFile* file = nullptr;   // the file, from byte `offset` on
  uint64_t offset = 0;
  bool readable() const { return data || file; }
  // Bytes [at, at + n) into dst.
  void read(uint64_t at, uint64_t n, uint8_t* dst) const {
    if (data) std::memcpy(dst, data + at, n);
    else file->pread_exact(offset + at, dst, n);
  }
  // Bytes [at, at + n): the memory itself, or `buf` filled from the file.
  const uint8_t* view(uint64_t at, uint64_t n, Buf& buf) const {
    if (data) return data + at;
    uint8_t* p = buf.reserve(n);
    file->pread_exact(offset + at, p, n);
    return p;
  }
};

// A segment of the .tzip (a tensor, or a gap of a safetensors input's data
// section): what the writer stores and how it gets its frames.
struct WriterItem {
  TensorEntry e;
  WriterSource src = WriterSource::kHost;
  ByteSource bytes;  // kHost: the raw bytes
  std::vector<EncodedFrame> frames;
  TensorWriter::EncodeFn enc;
  ByteSource cast_src;  // a cast prediction's FP32 source (readable() when e.predict is a cast)
  long delta_of = -1;   // tensor index in the reference (kHost only)
};

// One frame to write: chunk k of an item.
struct WriterUnit {
  size_t item;
  uint64_t off, n, k;  // raw offset in the tensor, raw bytes, chunk index
};

struct FramesWritten {
  uint64_t end = 0;          // file offset after the last frame (where the header goes)
  uint64_t encode_ns = 0;    // codec time summed over the threads
};

// Writes the preamble `pre` (64 bytes, hashed into fh) and every unit's
// frame, each at a multiple of 64, in unit order, through `sink`; appends a
// FrameRef per frame to tensors[unit.item].frames. `direct`: the sink's
// descriptor is O_DIRECT (writes gathered into aligned buffers of
// opt.direct_buffer_bytes). Returns after every write completed; throws
// the first error (Error naming `path`).
// dref: the delta reference (TensorWriterOptions::ref), dref_orig its
// safetensors content when given (ref_original), else null.
// tensors[i]: items[i]'s entry as stored. huge_pages: the frame and read
// buffers as Buf(true) (a whole-file pass, compress_file; file_io.hpp).
FramesWritten write_frames(const std::string& path, const uint8_t* pre, const std::vector<WriterItem>& items,
                           const std::vector<WriterUnit>& units, Reader* dref, const RefOriginal* dref_orig,
                           const TensorWriterOptions& opt, Sink& sink, bool direct, XXH64_state_t* fh,
                           std::vector<TensorEntry>& tensors, bool huge_pages = false);

[[noreturn]] void fail_io(const std::string& path, const std::string& what, int err);

}  // namespace tz::container::detail

// TensorWriter's frame stage (tzip_tensor_frames.cpp): the tensors' chunks
// coded in parallel and written in file order through the ordered pipeline
// (common/ordered_pipeline.h), with bounded memory. The rest of the writer
// (tensor table, prediction discovery, header, trailer, rename) is in
// tzip_tensor_writer.cpp.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tensorzip/container.hpp"

namespace tz::container::detail {

class RefOriginal;  // tzc_predict.hpp

enum class WriterSource { kHost, kFrames, kEncoder };

// A tensor added to a TensorWriter.
struct WriterItem {
  TensorEntry e;
  WriterSource src = WriterSource::kHost;
  const uint8_t* data = nullptr;
  std::vector<EncodedFrame> frames;
  TensorWriter::EncodeFn enc;
  long cast_from = -1;  // item index of the FP32 source (kHost only)
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
FramesWritten write_frames(const std::string& path, const uint8_t* pre, const std::vector<WriterItem>& items,
                           const std::vector<WriterUnit>& units, Reader* dref, const RefOriginal* dref_orig,
                           const TensorWriterOptions& opt, Sink& sink, bool direct, XXH64_state_t* fh,
                           std::vector<TensorEntry>& tensors);

[[noreturn]] void fail_io(const std::string& path, const std::string& what, int err);

}  // namespace tz::container::detail

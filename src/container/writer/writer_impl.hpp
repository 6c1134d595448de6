// The one .tzip writer's insides: TensorWriter (writer/tensor_writer.cpp),
// whose items are tensors in memory, pre-encoded frames, encoders, or the
// ranges of a safetensors file (compress_file, writer/compress_file.cpp); its
// prediction discovery (writer/discovery.cpp) and its frames
// (writer/write_frames.cpp).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensorzip/container.hpp"
#include "prediction.hpp"
#include "writer/write_frames.hpp"

namespace tz::container::detail {

struct TzipHeader;  // internal.hpp

struct PredictionRules {
  bool predict = true;  // casts
  double min_gain = 0.03;
  std::string ref, ref_original;  // deltas (TensorWriterOptions::ref, ref_original)
  // Cast candidates of a target: true (TensorWriter), those whose name ends
  // with the target's first (master.x for x), and the search stops at the
  // first exact one (find_cast_source's stop_at_exact), so that a save
  // holding many FP32 tensors of one shape stays linear in its size; false
  // (compress_file), every candidate in file order, the cheapest wins.
  bool name_first = true;
};

// What the discovery found and holds open while the frames are written.
struct Predictions {
  std::unique_ptr<Reader> dref;                       // the delta reference
  std::unique_ptr<RefOriginal> dref_orig;             // and its safetensors content, when given
  std::vector<std::unique_ptr<InFile>> other_files;  // other files' cast sources
  size_t casts = 0, deltas = 0;
};

// Finds the predicted tensors among the items whose bytes the writer reads
// (kHost): sets their e.predict, cast_src or delta_of; records the
// references used in h (first-use order) and h->major. `others`: files of
// the same checkpoint whose FP32 tensors may be cast sources. `path`: the
// output (references are recorded relative to its folder).
void find_predictions(std::vector<WriterItem>& items, const std::vector<CastSourceFile>& others,
                      const PredictionRules& rules, const std::string& path, TzipHeader* h, Predictions* out);

// A safetensors file as the writer's input (compress_file): every segment
// of its data section (tensors and gaps, file order) is an item read from
// the file, its header kept verbatim, the output written through OutFile
// (which takes on the input's attributes, and may be a stream).
struct FileInput {
  std::string path;
  SafetensorsInfo st;
  std::unique_ptr<InFile> file;
  std::vector<CastSourceFile> others;  // cast sources in other files (compress_checkpoint)
  int output_fd = -1;                  // WriteOptions::output_fd
};

struct WriterAccess {
  // A writer of `input`'s segments to `path`: nothing is created before
  // finish(). opt.chunk_bytes must hold the largest block of every segment.
  static std::unique_ptr<TensorWriter> for_file(const std::string& path, const TensorWriterOptions& opt,
                                                FileInput input);
};

}  // namespace tz::container::detail

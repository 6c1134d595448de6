// compress_file: a safetensors file into a .tzip, by the one writer
// (TensorWriter, writer/tensor_writer.cpp) over the file's segments: every
// tensor and gap of its data section is read from the file chunk by chunk
// while the frames are coded and written in order, so memory is bounded by
// the writer's slots (threads + 1 groups of chunks), never by the file size.
#include <algorithm>

#include "internal.hpp"
#include "file_io.hpp"
#include "writer/writer_impl.hpp"

namespace tz::container {

using namespace detail;

PassStats detail::compress_safetensors(const std::string& in, const std::string& out_path, const WriteOptions& opt,
                                       std::vector<CastSourceFile> others) {
  check_write_options(opt.level, opt.block_elems, opt.chunk_bytes, in);
  FileInput input;
  input.path = in;
  input.st = read_safetensors_info(in);
  input.file = std::make_unique<InFile>(in);
  if (input.file->size() != input.st.file_size) fail(ErrorKind::kIO, in + ": file changed while reading");
  check_not_same_file(in, out_path);
  input.file->advise_sequential();
  if (!opt.ref.empty() && !opt.predict)
    fail(ErrorKind::kUsage, "a previous checkpoint (--ref) needs prediction (drop --no-predict)");
  if (opt.ref.empty() && !opt.ref_original.empty())
    fail(ErrorKind::kUsage, "ref_original (--ref-original) needs a previous checkpoint (--ref)");
  input.others = std::move(others);
  input.output_fd = opt.output_fd;

  TensorWriterOptions o;
  o.level = opt.level;
  o.block_elems = opt.block_elems;
  o.threads = opt.threads;
  // A chunk holds at least one block of every segment.
  o.chunk_bytes = opt.chunk_bytes;
  auto widen = [&](const TensorEntry& t) {
    TensorEntry e = t;
    if (e.is_gap) e.codec_dtype = TZ_DTYPE_BYTES;
    e.block_elems = opt.block_elems ? opt.block_elems : default_block_elems(e.codec_dtype);
    o.chunk_bytes = std::max<uint64_t>(o.chunk_bytes, e.block_bytes());
  };
  for (const auto& t : input.st.tensors) widen(t);
  for (const auto& t : input.st.gaps) widen(t);
  // One group of chunks per thread plus one: the read or the write of one
  // group overlaps the coding of the others (more would only let reads run
  // ahead of the coders, each extra slot another set of buffers).
  o.slots = resolve_threads(opt.threads) + 1;
  o.force = opt.force;
  o.user_metadata = opt.user_metadata;
  o.predict = opt.predict;
  o.min_gain = opt.min_gain;
  o.ref = opt.ref;
  o.ref_original = opt.ref_original;
  // Progress in bytes of the input file: its header counts as done.
  if (opt.progress)
    o.progress = [base = input.st.data_start, p = opt.progress](uint64_t done, uint64_t total) {
      p(base + done, base + total);
    };
  const uint64_t file_size = input.st.file_size;
  std::unique_ptr<TensorWriter> w = WriterAccess::for_file(out_path, o, std::move(input));
  const TensorWriterStats st = w->finish();
  return PassStats{file_size, st.file_bytes};
}

PassStats compress_file(const std::string& in, const std::string& out_path, const WriteOptions& opt) {
  return detail::compress_safetensors(in, out_path, opt, {});
}

}  // namespace tz::container

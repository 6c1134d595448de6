// Reader::read_tensors: many tensors decoded together. Every frame of every
// requested tensor is an item of the ordered pipeline (common/ordered_pipeline.h),
// consecutive small frames grouped into one (group_items, pipeline.hpp),
// and goes, on any of the threads, straight into its place in its tensor's
// destination (Impl::read_frame: padding, xxh64, header and block checksums
// exactly as read_tensor, then the prediction of its range). Items are taken
// in file order, so the reads stay sequential; nothing is committed (each
// frame owns its bytes).
#include <algorithm>

#include "common/ordered_pipeline.h"
#include "pipeline.hpp"
#include "reader/reader_impl.hpp"

namespace tz::container {

using namespace detail;

void Reader::read_tensors(const std::vector<TensorRead>& reads, unsigned threads) {
  struct FrameJob {
    const TensorRead* r;
    size_t c;  // frame
    uint64_t raw_off;
    uint64_t file_off;
  };
  Impl& m = *impl_;
  const uint64_t chunk = chunk_bytes();
  std::vector<FrameJob> jobs;
  for (const TensorRead& r : reads) {
    if (r.index >= tensors().size()) fail(ErrorKind::kUsage, path() + ": tensor index out of range");
    const TensorEntry& t = tensors()[r.index];
    if (r.capacity < t.raw_size())
      fail(ErrorKind::kUsage, path() + ": tensor '" + t.name + "': destination too small");
    if (t.raw_size() && !r.dst) fail(ErrorKind::kUsage, path() + ": tensor '" + t.name + "': null destination");
    for (size_t c = 0; c < t.frames.size(); ++c) jobs.push_back(FrameJob{&r, c, c * chunk, t.frames[c].offset});
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const FrameJob& a, const FrameJob& b) { return a.file_off < b.file_off; });
  // Consecutive small frames are one item (group_items, as in the
  // container's passes): a file of many small tensors is not handed
  // between threads frame by frame.
  const std::vector<ItemGroup> groups = group_items(jobs.size(), [&](size_t i) {
    const TensorEntry& t = tensors()[jobs[i].r->index];
    return std::min<uint64_t>(chunk, t.raw_size() - jobs[i].raw_off);
  });
  const unsigned n = (unsigned)std::min<size_t>(resolve_threads(threads), std::max<size_t>(1, groups.size()));
  tz::cpu::OrderedPipeline::Stages st;
  st.work = [&](size_t gi, size_t, unsigned) {
    auto cx = m.lease();
    for (size_t i = groups[gi].first; i < groups[gi].first + groups[gi].count; ++i) {
      const FrameJob& j = jobs[i];
      const TensorEntry& t = tensors()[j.r->index];
      const FrameRef& fr = t.frames[j.c];
      uint8_t* const dst = static_cast<uint8_t*>(j.r->dst) + j.raw_off;
      if (fr.size == 0)  // all-zero residual chunk (section 12.2)
        std::memset(dst, 0, fr.raw_size);
      else
        m.read_frame(cx, t, j.r->index, j.c, dst);
      m.apply_prediction(t, j.raw_off, dst, fr.raw_size);
    }
  };
  st.poll = check_cancel;
  tz::cpu::OrderedPipeline p(groups.size(), 2 * (size_t)n, std::move(st));
  p.run(n);
}

}  // namespace tz::container

#include "restore_ring.hpp"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "../io/read_queue.hpp"
#include "checkpoint_internal.hpp"
#include "common/ordered_pipeline.h"

namespace tz::checkpoint::detail {

void read_frames_ahead(std::span<const FrameRead> frames, unsigned workers, tz::io::Backend io,
                       std::atomic<bool>& direct_ok, std::string* backend,
                       const std::function<std::string(size_t)>& describe,
                       const std::function<void(size_t, const uint8_t*, unsigned)>& consume) {
  if (frames.empty()) return;
  const unsigned n_workers = (unsigned)std::min<size_t>(std::max(1u, workers), frames.size());
  const size_t window = std::min<size_t>(frames.size(), std::max<size_t>(4, 2 * (size_t)n_workers));
  struct ReadBuf {  // one per pipeline slot
    void* buf = nullptr;
    uint64_t cap = 0;
    int rerr = 0;          // the read's errno, 0: done
    uint64_t got = 0;      // bytes read
    uint64_t lo = 0;       // file offset of buf[0]
    bool direct = false;   // read with O_DIRECT
    ~ReadBuf() { std::free(buf); }
  };
  std::vector<ReadBuf> bufs(window);
  std::vector<std::vector<uint8_t>> rereads(n_workers);  // buffered re-reads where O_DIRECT was refused
  constexpr uint64_t kAlign = 4096;

  // Declared before the pipeline: every read it queues has completed when
  // run() returns (the pipeline waits for each ready()), and the queue then
  // has nothing left to drain.
  tz::io::ReadQueue rq(io, 2, (unsigned)std::min<size_t>(window, 64));
  *backend = tz::io::backend_name(rq.backend());

  tz::cpu::OrderedPipeline* pipeline = nullptr;
  tz::cpu::OrderedPipeline::Stages st;
  st.issue_completes_later = true;
  st.read_ahead = window;  // keep every slot's read in flight
  st.issue = [&](size_t j, size_t slot) {
    ReadBuf& sl = bufs[slot];
    const FrameRead& fr = frames[j];
    const bool direct = fr.dfd >= 0 && direct_ok.load(std::memory_order_relaxed);
    // O_DIRECT: offset, length and buffer aligned to 4 KiB; the frame lies
    // inside the aligned range (the read may stop at end of file).
    const uint64_t lo = direct ? fr.offset & ~(kAlign - 1) : fr.offset;
    const uint64_t need = fr.offset + fr.size - lo;
    const uint64_t len = direct ? (need + kAlign - 1) & ~(kAlign - 1) : need;
    if (sl.cap < len) {
      std::free(sl.buf);
      sl.buf = nullptr;
      sl.cap = 0;
      if (::posix_memalign(&sl.buf, kAlign, len) != 0) fail(ErrorKind::kInternal, describe(j) + ": out of memory");
      sl.cap = len;
    }
    sl.lo = lo;
    sl.direct = direct;
    sl.rerr = 0;
    sl.got = 0;
    if (fr.size == 0) {  // empty frame (exact prediction): nothing to read
      pipeline->ready(j);
      return;
    }
    rq.submit(direct ? fr.dfd : fr.fd, lo, sl.buf, len, [&, j, slot](int e, size_t got) {
      bufs[slot].rerr = e;
      bufs[slot].got = got;
      pipeline->ready(j);  // its errors are the work stage's to judge (O_DIRECT refused: re-read)
    });
  };
  st.work = [&](size_t j, size_t slot, unsigned w) {
    const ReadBuf& sl = bufs[slot];
    const FrameRead& fr = frames[j];
    const uint8_t* frame = nullptr;
    if (fr.size) {
      const uint64_t need = fr.offset + fr.size - sl.lo;
      if (sl.rerr == EINVAL && sl.direct) {
        direct_ok = false;  // alignment refused here: buffered reads from now on
      } else if (sl.rerr) {
        fail(sl.rerr == EIO ? ErrorKind::kCorrupt : ErrorKind::kIO,
             describe(j) + ": read failed: " + std::strerror(sl.rerr));
      } else if (sl.got < need) {
        fail(ErrorKind::kCorrupt, describe(j) + ": read failed: file truncated");
      } else {
        frame = static_cast<const uint8_t*>(sl.buf) + (fr.offset - sl.lo);
      }
      if (!frame) {
        std::vector<uint8_t>& buf = rereads[w];
        if (buf.size() < fr.size) buf.resize(fr.size);
        if (const int e = tz::io::pread_full(fr.fd, buf.data(), fr.size, fr.offset))
          fail(e == EIO ? ErrorKind::kCorrupt : ErrorKind::kIO, describe(j) + ": read failed: " + std::strerror(e));
        frame = buf.data();
      }
    }
    consume(j, frame, w);
  };
  tz::cpu::OrderedPipeline p(frames.size(), window, std::move(st));
  pipeline = &p;
  p.run(n_workers);
}

}  // namespace tz::checkpoint::detail

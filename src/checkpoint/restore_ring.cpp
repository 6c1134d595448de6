#include "restore_ring.hpp"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "../io/read_queue.hpp"
#include "checkpoint_internal.hpp"

namespace tz::checkpoint::detail {

void read_frames_ahead(std::span<const FrameRead> frames, unsigned workers, tz::io::Backend io,
                       std::atomic<bool>& direct_ok, std::string* backend,
                       const std::function<std::string(size_t)>& describe,
                       const std::function<void(size_t, const uint8_t*, unsigned)>& consume) {
  if (frames.empty()) return;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr err;
  bool stop = false;
  const unsigned n_workers = (unsigned)std::min<size_t>(std::max(1u, workers), frames.size());
  const size_t n_slots = std::min<size_t>(frames.size(), std::max<size_t>(4, 2 * (size_t)n_workers));
  struct RSlot {
    void* buf = nullptr;
    uint64_t cap = 0;
    size_t job = 0;
    bool ready = false;    // read completed (or failed: rerr)
    int rerr = 0;
    uint64_t got = 0;
    uint64_t lo = 0;       // file offset of buf[0]
    bool direct = false;   // read with O_DIRECT
    ~RSlot() { std::free(buf); }
  };
  std::vector<RSlot> slots(n_slots);
  for (size_t i = 0; i < n_slots; ++i) slots[i].job = i;
  constexpr uint64_t kAlign = 4096;
  auto set_error = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(mu);
    if (!err) err = e;
    stop = true;
    cv.notify_all();
  };
  {
    tz::io::ReadQueue rq(io, 2, (unsigned)std::min<size_t>(n_slots, 64));
    *backend = tz::io::backend_name(rq.backend());
    std::thread reader([&] {
      struct Drain {  // this thread's io_uring reads complete through it: stay until they have
        tz::io::ReadQueue& q;
        ~Drain() { q.drain(); }
      } drain{rq};
      try {
        for (size_t j = 0; j < frames.size(); ++j) {
          RSlot& sl = slots[j % n_slots];
          {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return stop || (sl.job == j && !sl.ready); });
            if (stop) return;
          }
          const FrameRead& fr = frames[j];
          const bool direct = fr.dfd >= 0 && direct_ok.load(std::memory_order_relaxed);
          // O_DIRECT: offset, length and buffer aligned to 4 KiB; the frame
          // lies inside the aligned range (the read may stop at end of file).
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
          if (fr.size == 0) {  // empty frame (exact prediction): nothing to read
            std::lock_guard<std::mutex> lk(mu);
            sl.ready = true, sl.rerr = 0, sl.got = 0;
            cv.notify_all();
            continue;
          }
          rq.submit(direct ? fr.dfd : fr.fd, lo, sl.buf, len, [&, j](int e, size_t got) {
            std::lock_guard<std::mutex> lk(mu);
            RSlot& s2 = slots[j % n_slots];
            s2.ready = true, s2.rerr = e, s2.got = got;
            cv.notify_all();
          });
        }
      } catch (...) {
        set_error(std::current_exception());
      }
    });
    auto worker = [&](unsigned w) {
      std::vector<uint8_t> buf;  // buffered re-read where O_DIRECT was refused
      try {
        for (;;) {
          const size_t j = next.fetch_add(1);
          if (j >= frames.size()) break;
          RSlot& sl = slots[j % n_slots];
          {
            std::unique_lock<std::mutex> lk(mu);
            cv.wait(lk, [&] { return stop || (sl.job == j && sl.ready); });
            if (stop) break;
          }
          // The slot goes to job j + n_slots once this one is consumed.
          struct Release {
            std::mutex& mu;
            std::condition_variable& cv;
            RSlot& sl;
            size_t n;
            ~Release() {
              std::lock_guard<std::mutex> lk(mu);
              sl.ready = false;
              sl.job += n;
              cv.notify_all();
            }
          } release{mu, cv, sl, n_slots};
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
              if (buf.size() < fr.size) buf.resize(fr.size);
              if (const int e = tz::io::pread_full(fr.fd, buf.data(), fr.size, fr.offset))
                fail(e == EIO ? ErrorKind::kCorrupt : ErrorKind::kIO, describe(j) + ": read failed: " + std::strerror(e));
              frame = buf.data();
            }
          }
          consume(j, frame, w);
        }
      } catch (...) {
        set_error(std::current_exception());
      }
    };
    std::vector<std::thread> th;
    try {
      for (unsigned i = 1; i < n_workers; ++i) th.emplace_back(worker, i);
    } catch (const std::system_error& e) {  // no thread for a worker: stop, report
      set_error(std::make_exception_ptr(Error(ErrorKind::kInternal, std::string("cannot start a decode thread: ") + e.what())));
    }
    worker(0);
    for (auto& t : th) t.join();
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;  // the reader may wait for a slot no worker will free
      cv.notify_all();
    }
    reader.join();
  }  // rq drains before the slots go away
  if (err) std::rethrow_exception(err);
}

}  // namespace tz::checkpoint::detail

// Weights kept compressed in memory, decoded group by group just before use
// (doc/python.md, "Weights that stay compressed"): the prepared plan of one
// model for the CPU. A group is what one forward pre-hook needs at once (the
// weights of one transformer block): its frames are validated and cut into
// balanced decode tasks once, when the plan is built, so that a decode is one
// parallel loop over the plan's workers, with no scheduling decisions, no
// allocation and no header walk of our own per forward.
//
// Decoding goes through the public C API: each worker owns a one-thread
// tz_ctx and decodes its tasks with tz_ctx_decompress_blocks_ex (whose
// per-call prefix check is the codec's own: header CRC, tables, index).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tz::cpu {
class ThreadPool;
}
struct tz_ctx_s;

namespace tz::runtime {

// A frame that does not validate when added (names the tensor).
struct ResidentFrameError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// A block that fails to decode (checksum, corrupt data): names the tensor,
// the frame and the block.
struct ResidentDecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ResidentPlan {
 public:
  // threads: decode workers (0 = all hardware threads). The calling thread of
  // decode() (or the plan's prefetch thread for start()) is one of them.
  explicit ResidentPlan(unsigned threads);
  ~ResidentPlan();
  ResidentPlan(const ResidentPlan&) = delete;
  ResidentPlan& operator=(const ResidentPlan&) = delete;

  // Adds one frame (exactly one tz_compress frame of frame_size bytes, which
  // must stay valid and unchanged while the plan exists) to group `group`,
  // decoding to [dst_offset, dst_offset + raw size) of the group's
  // destination. Checks the whole prefix and the frame size now; throws
  // ResidentFrameError naming `name` otherwise. Returns the raw size.
  uint64_t add(size_t group, const std::string& name, const void* frame, size_t frame_size, uint64_t dst_offset);
  // Cuts every group into decode tasks. add() is refused afterwards.
  void finalize();

  unsigned threads() const;
  size_t groups() const { return groups_.size(); }
  size_t frames(size_t group) const;
  // Bytes a destination of the group must hold (end of its last output).
  uint64_t group_bytes(size_t group) const;
  size_t tasks(size_t group) const;

  // Decodes every frame of the group into dst (capacity bytes) and verifies
  // every block's checksum. Blocks until done; waits first for a decode
  // started with start(). Throws ResidentDecodeError.
  void decode(size_t group, void* dst, size_t capacity);
  // The same on the plan's own thread: returns at once; wait() blocks until
  // it is done and rethrows its error. One background decode at a time (a
  // second start() waits for the first one).
  void start(size_t group, void* dst, size_t capacity);
  void wait();
  bool busy();

  // Totals since the plan was made: decoded bytes and decode wall seconds
  // (of decode() and background decodes).
  uint64_t decoded_bytes() const { return decoded_bytes_; }
  double decode_seconds() const { return decode_seconds_; }

 private:
  struct Frame {
    std::string name;
    const uint8_t* data;
    size_t size;
    size_t prefix_size;
    uint64_t dst_offset;
    uint64_t raw_size;
    unsigned n_blocks;
  };
  struct Task {
    uint32_t frame;  // index into the group's frames
    uint32_t first, count;
    uint64_t blocks_offset, blocks_size;  // compressed bytes, relative to the frame start
    uint64_t raw_offset, raw_size;        // decoded bytes, relative to the frame's output
  };
  struct Group {
    std::vector<Frame> frames;
    std::vector<Task> tasks;  // largest first
    uint64_t bytes = 0;
  };
  void check_group(size_t group) const;
  void run(size_t group, uint8_t* dst, size_t capacity);  // one parallel loop; caller holds run_mu_
  void background_loop();

  std::vector<Group> groups_;
  bool final_ = false;
  std::unique_ptr<tz::cpu::ThreadPool> pool_;
  std::vector<tz_ctx_s*> ctx_;  // one per worker
  std::mutex run_mu_;           // one parallel loop at a time
  uint64_t decoded_bytes_ = 0;
  double decode_seconds_ = 0;

  // Background decode (start/wait).
  std::mutex bg_mu_;
  std::condition_variable bg_cv_;
  bool bg_pending_ = false, bg_running_ = false, bg_stop_ = false;
  size_t bg_group_ = 0;
  uint8_t* bg_dst_ = nullptr;
  size_t bg_cap_ = 0;
  std::exception_ptr bg_error_;
  std::thread bg_thread_;
};

}  // namespace tz::runtime

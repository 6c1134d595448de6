// Weights kept compressed in memory, decoded group by group just before use
// (doc/python.md, "Weights that stay compressed"): the prepared plan of one
// model for the CPU. A group is what one forward pre-hook needs at once (the
// weights of one transformer block): its frames are validated and cut into
// balanced decode tasks once, when the plan is built, so that a decode is one
// parallel loop over the plan's workers, with no scheduling decisions, no
// allocation and no header walk of our own per forward.
//
// Each frame's prefix is parsed and validated once, when it is added, by the
// codec's own parser, and kept as a tz::cpu::PreparedFrame (its block index
// and rANS decode tables): a decode parses no header and builds no table. The
// tables take memory (16 KiB per frequency table): they are kept for frames
// while their total stays within the plan's table budget (counted in
// prepared_bytes()); a frame past the budget is decoded through
// tz::cpu::decompress_blocks, which checks its prefix and builds its tables
// per call. Either way every block's header and checksum is checked on every
// decode. Each worker owns a one-thread codec context.
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
#include <unordered_map>
#include <vector>

#include "cpu/frame.h"

namespace tz::resident {

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
  // table_budget: bytes of prepared frames (decode tables, index copies) the
  // plan may keep.
  explicit ResidentPlan(unsigned threads, uint64_t table_budget = kDefaultTableBudget);
  static constexpr uint64_t kDefaultTableBudget = 64ull << 20;
  ~ResidentPlan();
  ResidentPlan(const ResidentPlan&) = delete;
  ResidentPlan& operator=(const ResidentPlan&) = delete;

  // Adds one frame (exactly one tz_compress frame of frame_size bytes, which
  // must stay valid and unchanged while the plan exists) to group `group`,
  // decoding to [dst_offset, dst_offset + raw size) of the group's
  // destination. Checks the whole prefix and the frame size now; throws
  // ResidentFrameError naming `name` otherwise. Returns the raw size. The
  // same frame (same address) in several groups is prepared once.
  uint64_t add(size_t group, const std::string& name, const void* frame, size_t frame_size, uint64_t dst_offset);
  // Cuts every group into decode tasks. add() is refused afterwards.
  void finalize();

  unsigned threads() const;
  size_t groups() const { return groups_.size(); }
  size_t frames(size_t group) const;
  // Bytes a destination of the group must hold (end of its last output).
  uint64_t group_bytes(size_t group) const;
  size_t tasks(size_t group) const;
  // Frames decoded with prepared tables, and the bytes those hold.
  size_t prepared_frames() const { return prepared_.size(); }
  uint64_t prepared_bytes() const { return prepared_bytes_; }
  uint64_t table_budget() const { return table_budget_; }

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

  // Decodes blocks [first, first + count) of frame `frame` of group `group`
  // alone into dst (capacity bytes) on the calling thread (an embedding
  // lookup reads only the blocks holding its rows); returns the bytes
  // written. Runs beside decode() and start() (a context of its own); one
  // decode_blocks at a time. Throws ResidentDecodeError, std::out_of_range.
  uint64_t decode_blocks(size_t group, size_t frame, uint32_t first, uint32_t count, void* dst, size_t capacity);

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
    const tz::cpu::PreparedFrame* prepared;  // null: past the table budget
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
  // The frame's prepared form (made once per frame address), or null past
  // the table budget.
  const tz::cpu::PreparedFrame* prepare(const std::string& name, const uint8_t* frame, size_t prefix_size);
  void run(size_t group, uint8_t* dst, size_t capacity);  // one parallel loop; caller holds run_mu_
  void background_loop();

  std::vector<Group> groups_;
  bool final_ = false;
  std::unique_ptr<tz::cpu::ThreadPool> pool_;
  std::vector<tz::cpu::ContextPtr> ctx_;  // one per worker, one thread each
  uint64_t table_budget_;
  std::vector<tz::cpu::PreparedFramePtr> prepared_;
  std::unordered_map<const uint8_t*, const tz::cpu::PreparedFrame*> prepared_of_;
  uint64_t prepared_bytes_ = 0;
  std::mutex run_mu_;           // one parallel loop at a time
  tz::cpu::ContextPtr blocks_ctx_;  // decode_blocks, under blocks_mu_
  std::mutex blocks_mu_;
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

}  // namespace tz::resident

#include "resident/plan.hpp"

#include <algorithm>
#include <chrono>

#include "cpu/frame.h"
#include "common/thread_pool.h"
#include "tensorzip/tensorzip.h"

namespace tz::resident {

namespace {

std::string codec_message(size_t code) {
  std::string m = tz_get_error_name(code);
  const char* d = tz_last_error_detail();
  if (d && *d) m += std::string(" (") + d + ")";
  return m;
}

}  // namespace

ResidentPlan::ResidentPlan(unsigned threads, uint64_t table_budget)
    : pool_(std::make_unique<tz::cpu::ThreadPool>(threads)), table_budget_(table_budget) {
  ctx_.reserve(pool_->size());
  for (unsigned w = 0; w < pool_->size(); ++w) ctx_.push_back(tz::cpu::make_context(1));
  blocks_ctx_ = tz::cpu::make_context(1);
  bg_thread_ = std::thread([this] { background_loop(); });
}

ResidentPlan::~ResidentPlan() {
  {
    std::lock_guard<std::mutex> lk(bg_mu_);
    bg_stop_ = true;
  }
  bg_cv_.notify_all();
  bg_thread_.join();
}

unsigned ResidentPlan::threads() const { return pool_->size(); }

uint64_t ResidentPlan::add(size_t group, const std::string& name, const void* frame, size_t frame_size,
                           uint64_t dst_offset) {
  if (final_) throw std::logic_error("resident plan: add() after finalize()");
  if (!frame) throw ResidentFrameError("tensor '" + name + "': frame is null");
  tz_frame_info info{};
  const size_t r = tz_frame_inspect(frame, frame_size, &info);
  if (tz_is_error(r)) throw ResidentFrameError("tensor '" + name + "': invalid frame: " + codec_message(r));
  if (info.frame_size != frame_size)
    throw ResidentFrameError("tensor '" + name + "': frame is " + std::to_string(info.frame_size) +
                             " bytes but " + std::to_string(frame_size) + " were given");
  if (dst_offset > UINT64_MAX - info.raw_size) throw ResidentFrameError("tensor '" + name + "': offset overflow");
  if (groups_.size() <= group) groups_.resize(group + 1);
  Group& g = groups_[group];
  if (g.frames.size() >= UINT32_MAX) throw ResidentFrameError("resident plan: too many frames in one group");
  const auto* data = static_cast<const uint8_t*>(frame);
  g.frames.push_back(Frame{name, data, frame_size, (size_t)info.prefix_size, dst_offset, info.raw_size,
                           info.n_blocks, prepare(name, data, (size_t)info.prefix_size)});
  g.bytes = std::max(g.bytes, dst_offset + info.raw_size);
  return info.raw_size;
}

const tz::cpu::PreparedFrame* ResidentPlan::prepare(const std::string& name, const uint8_t* frame,
                                                    size_t prefix_size) {
  if (auto it = prepared_of_.find(frame); it != prepared_of_.end()) return it->second;
  tz::cpu::PreparedFramePtr p;
  const size_t r = tz::cpu::prepare_frame(frame, prefix_size, &p);
  if (tz_is_error(r)) throw ResidentFrameError("tensor '" + name + "': invalid frame: " + codec_message(r));
  const uint64_t bytes = tz::cpu::prepared_frame_bytes(*p);
  if (prepared_bytes_ + bytes > table_budget_) return nullptr;  // decoded with per-call tables
  prepared_bytes_ += bytes;
  prepared_.push_back(std::move(p));
  return prepared_of_[frame] = prepared_.back().get();
}

void ResidentPlan::finalize() {
  if (final_) return;
  // Tasks: runs of codec blocks of about equal work, about 4 per worker per
  // group (fewer calls when blocks are many, enough for balance when a group
  // is a few tensors of a few blocks each), handed out largest first.
  const unsigned w = pool_->size();
  for (Group& g : groups_) {
    uint64_t total_blocks = 0;
    for (const Frame& f : g.frames) total_blocks += f.n_blocks;
    const uint64_t per_task = std::max<uint64_t>(1, total_blocks / (4ull * w));
    for (uint32_t fi = 0; fi < g.frames.size(); ++fi) {
      const Frame& f = g.frames[fi];
      for (uint64_t b = 0; b < f.n_blocks; b += per_task) {
        Task t{};
        t.frame = fi;
        t.first = (uint32_t)b;
        t.count = (uint32_t)std::min<uint64_t>(per_task, f.n_blocks - b);
        const size_t r = tz_frame_block_range(f.data, f.prefix_size, t.first, t.count, &t.blocks_offset,
                                              &t.blocks_size, &t.raw_offset, &t.raw_size);
        if (tz_is_error(r)) throw ResidentFrameError("tensor '" + f.name + "': " + codec_message(r));
        if (t.blocks_offset + t.blocks_size > f.size || t.raw_offset + t.raw_size > f.raw_size)
          throw ResidentFrameError("tensor '" + f.name + "': block range outside the frame");
        g.tasks.push_back(t);
      }
    }
    std::stable_sort(g.tasks.begin(), g.tasks.end(),
                     [](const Task& a, const Task& b) { return a.raw_size > b.raw_size; });
  }
  final_ = true;
}

void ResidentPlan::check_group(size_t group) const {
  if (!final_) throw std::logic_error("resident plan: decode before finalize()");
  if (group >= groups_.size()) throw std::out_of_range("resident plan: no group " + std::to_string(group));
}

size_t ResidentPlan::frames(size_t group) const {
  return group < groups_.size() ? groups_[group].frames.size() : 0;
}
uint64_t ResidentPlan::group_bytes(size_t group) const {
  return group < groups_.size() ? groups_[group].bytes : 0;
}
size_t ResidentPlan::tasks(size_t group) const { return group < groups_.size() ? groups_[group].tasks.size() : 0; }

void ResidentPlan::run(size_t group, uint8_t* dst, size_t capacity) {
  const Group& g = groups_[group];
  if (capacity < g.bytes)
    throw std::invalid_argument("resident plan: destination holds " + std::to_string(capacity) + " bytes, group " +
                                std::to_string(group) + " needs " + std::to_string(g.bytes));
  if (g.tasks.empty()) return;
  if (!dst) throw std::invalid_argument("resident plan: destination is null");
  const auto t0 = std::chrono::steady_clock::now();
  std::mutex err_mu;
  size_t err_task = SIZE_MAX;
  std::string err;
  pool_->parallel_for(g.tasks.size(), [&](size_t ti, unsigned w) {
    const Task& t = g.tasks[ti];
    const Frame& f = g.frames[t.frame];
    unsigned bad = 0;
    uint8_t* out = dst + f.dst_offset + t.raw_offset;
    const uint8_t* blocks = f.data + t.blocks_offset;
    const size_t r = tz::cpu::guarded([&] {
      return f.prepared ? tz::cpu::decompress_blocks_prepared(*ctx_[w], *f.prepared, out, t.raw_size, blocks,
                                                              t.blocks_size, t.first, t.count, &bad)
                        : tz::cpu::decompress_blocks(*ctx_[w], out, t.raw_size, f.data, f.prefix_size, blocks,
                                                     t.blocks_size, t.first, t.count, &bad);
    });
    if (tz_is_error(r) || r != t.raw_size) {
      std::string m = "tensor '" + f.name + "': block " + std::to_string(bad) + " of " +
                      std::to_string(f.n_blocks) + ": " +
                      (tz_is_error(r) ? codec_message(r) : std::string("decoded size differs from the plan"));
      std::lock_guard<std::mutex> lk(err_mu);
      if (ti < err_task) {
        err_task = ti;
        err = std::move(m);
      }
    }
  });
  decode_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (err_task != SIZE_MAX) throw ResidentDecodeError("resident weights: " + err);
  decoded_bytes_ += g.bytes;
}

uint64_t ResidentPlan::decode_blocks(size_t group, size_t frame, uint32_t first, uint32_t count, void* dst,
                                     size_t capacity) {
  check_group(group);
  const Group& g = groups_[group];
  if (frame >= g.frames.size())
    throw std::out_of_range("resident plan: group " + std::to_string(group) + " has no frame " + std::to_string(frame));
  const Frame& f = g.frames[frame];
  uint64_t off = 0, size = 0, raw = 0;
  size_t r = f.prepared ? tz::cpu::prepared_block_range(*f.prepared, first, count, &off, &size, &raw)
                        : tz_frame_block_range(f.data, f.prefix_size, first, count, &off, &size, nullptr, &raw);
  if (tz_is_error(r))
    throw std::out_of_range("resident plan: tensor '" + f.name + "': blocks " + std::to_string(first) + "+" +
                            std::to_string(count) + ": " + codec_message(r));
  if (off + size > f.size) throw ResidentDecodeError("resident weights: tensor '" + f.name + "': block range outside the frame");
  if (capacity < raw)
    throw std::invalid_argument("resident plan: destination holds " + std::to_string(capacity) + " bytes, blocks need " +
                                std::to_string(raw));
  auto* out = static_cast<uint8_t*>(dst);
  unsigned bad = 0;
  std::lock_guard<std::mutex> lk(blocks_mu_);
  r = tz::cpu::guarded([&] {
    return f.prepared ? tz::cpu::decompress_blocks_prepared(*blocks_ctx_, *f.prepared, out, capacity, f.data + off, size,
                                                            first, count, &bad)
                      : tz::cpu::decompress_blocks(*blocks_ctx_, out, capacity, f.data, f.prefix_size, f.data + off,
                                                   size, first, count, &bad);
  });
  if (tz_is_error(r))
    throw ResidentDecodeError("resident weights: tensor '" + f.name + "': block " + std::to_string(bad) + " of " +
                              std::to_string(f.n_blocks) + ": " + codec_message(r));
  return r;
}

void ResidentPlan::decode(size_t group, void* dst, size_t capacity) {
  check_group(group);
  {
    std::unique_lock<std::mutex> lk(bg_mu_);
    bg_cv_.wait(lk, [&] { return !bg_pending_ && !bg_running_; });
  }
  std::lock_guard<std::mutex> lk(run_mu_);
  run(group, static_cast<uint8_t*>(dst), capacity);
}

void ResidentPlan::start(size_t group, void* dst, size_t capacity) {
  check_group(group);
  std::unique_lock<std::mutex> lk(bg_mu_);
  bg_cv_.wait(lk, [&] { return !bg_pending_ && !bg_running_; });
  bg_group_ = group;
  bg_dst_ = static_cast<uint8_t*>(dst);
  bg_cap_ = capacity;
  bg_error_ = nullptr;
  bg_pending_ = true;
  lk.unlock();
  bg_cv_.notify_all();
}

void ResidentPlan::wait() {
  std::unique_lock<std::mutex> lk(bg_mu_);
  bg_cv_.wait(lk, [&] { return !bg_pending_ && !bg_running_; });
  if (bg_error_) {
    std::exception_ptr e = bg_error_;
    bg_error_ = nullptr;
    std::rethrow_exception(e);
  }
}

bool ResidentPlan::busy() {
  std::lock_guard<std::mutex> lk(bg_mu_);
  return bg_pending_ || bg_running_;
}

void ResidentPlan::background_loop() {
  std::unique_lock<std::mutex> lk(bg_mu_);
  for (;;) {
    bg_cv_.wait(lk, [&] { return bg_stop_ || bg_pending_; });
    if (bg_stop_) return;
    bg_pending_ = false;
    bg_running_ = true;
    const size_t group = bg_group_;
    uint8_t* dst = bg_dst_;
    const size_t cap = bg_cap_;
    lk.unlock();
    std::exception_ptr e;
    try {
      std::lock_guard<std::mutex> run_lk(run_mu_);
      run(group, dst, cap);
    } catch (...) {
      e = std::current_exception();
    }
    lk.lock();
    bg_error_ = e;
    bg_running_ = false;
    bg_cv_.notify_all();
  }
}

}  // namespace tz::resident

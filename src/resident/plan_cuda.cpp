#include "resident/plan_cuda.hpp"

#include <algorithm>

namespace tz::resident {

void ResidentPlanCuda::add(size_t group, const std::string& name, const void* d_frame, size_t frame_size,
                           uint64_t raw_size, uint64_t dst_offset) {
  if (final_) throw std::logic_error("resident CUDA plan: add() after finalize()");
  if (!d_frame || frame_size < 32 || (reinterpret_cast<uintptr_t>(d_frame) & 3))
    throw std::invalid_argument("tensor '" + name + "': device frame is null, shorter than a header or not 4-byte aligned");
  if (dst_offset > UINT64_MAX - raw_size) throw std::invalid_argument("tensor '" + name + "': offset overflow");
  if (groups_.size() <= group) groups_.resize(group + 1);
  Group& g = groups_[group];
  tz_cuda_decompress_item it{};
  it.src = d_frame;
  it.src_size = frame_size;
  it.dst = reinterpret_cast<void*>(static_cast<uintptr_t>(dst_offset));  // made absolute by decode()
  it.dst_capacity = raw_size;
  g.items.push_back(it);
  g.offsets.push_back(dst_offset);
  g.names.push_back(name);
  g.bytes = std::max(g.bytes, dst_offset + raw_size);
}

void ResidentPlanCuda::finalize() {
  if (final_) return;
  for (Group& g : groups_) {
    temp_bytes_ = std::max(temp_bytes_, tz_cuda_decompress_temp_size(g.items.data(), g.items.size()));
    max_frames_ = std::max(max_frames_, g.items.size());
  }
  final_ = true;
}

size_t ResidentPlanCuda::decode(size_t group, void* d_dst, size_t capacity, void* d_temp, size_t temp_size,
                                size_t* d_sizes, int* d_status, cudaStream_t stream) {
  if (!final_) throw std::logic_error("resident CUDA plan: decode before finalize()");
  if (group >= groups_.size()) throw std::out_of_range("resident CUDA plan: no group " + std::to_string(group));
  Group& g = groups_[group];
  if (capacity < g.bytes || (g.bytes && !d_dst))
    throw std::invalid_argument("resident CUDA plan: destination of group " + std::to_string(group) + " holds " +
                                std::to_string(capacity) + " bytes, needs " + std::to_string(g.bytes));
  if (g.items.empty()) return 0;
  uint8_t* base = static_cast<uint8_t*>(d_dst);
  if (g.base != base) {  // descriptors follow the destination (two scratch slots: built twice, then reused)
    for (size_t i = 0; i < g.items.size(); ++i) g.items[i].dst = base + g.offsets[i];
    g.base = base;
  }
  return tz_cuda_decompress(g.items.data(), g.items.size(), d_temp, temp_size, d_sizes, d_status, stream);
}

}  // namespace tz::resident

// The CUDA side of resident weights (plan.hpp is the CPU side): a
// model's frames already in device memory, grouped per forward pre-hook, with
// the batch decode descriptors (tz_cuda_decompress_item) built once. decode()
// only enqueues tz_cuda_decompress on the caller's stream: no host
// synchronisation, no allocation, no CUDA runtime call of its own, so it can
// run on a side stream ahead of the compute stream and inside a CUDA graph
// capture (the temp memory and the status arrays are the caller's, fixed).
// Per-item decoded sizes and statuses land in device arrays the caller reads
// when it chooses (e.g. asynchronously after a forward).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensorzip/tensorzip_cuda.h"

namespace tz::resident {

class ResidentPlanCuda {
 public:
  // Adds a frame held in device memory (d_frame, 4-byte aligned, frame_size
  // bytes; validated by the caller on the host before it was copied there,
  // raw_size from that check) to `group`, decoding to [dst_offset,
  // dst_offset + raw_size) of the group's destination; dst_offset must keep
  // the element alignment (a multiple of 256 always does). The decoder writes
  // at most raw_size bytes there whatever the device bytes hold.
  void add(size_t group, const std::string& name, const void* d_frame, size_t frame_size, uint64_t raw_size,
           uint64_t dst_offset);
  void finalize();

  size_t groups() const { return groups_.size(); }
  size_t frames(size_t group) const { return group < groups_.size() ? groups_[group].items.size() : 0; }
  uint64_t group_bytes(size_t group) const { return group < groups_.size() ? groups_[group].bytes : 0; }
  const std::string& name(size_t group, size_t item) const { return groups_.at(group).names.at(item); }
  // Temporary device memory one decode() needs (the largest group's).
  size_t temp_bytes() const { return temp_bytes_; }
  // Entries the d_sizes / d_status arrays need (the largest group's frames).
  size_t max_frames() const { return max_frames_; }

  // Enqueues the decode of every frame of the group into d_dst (capacity
  // bytes >= group_bytes) on `stream`. d_temp: 256-byte aligned, >= temp_bytes;
  // d_sizes / d_status: >= frames(group) entries, item i of the group's
  // frames in add() order. Returns 0 or a tz error code (call-level: bad
  // arguments, launch failure); per-item errors are in d_status.
  size_t decode(size_t group, void* d_dst, size_t capacity, void* d_temp, size_t temp_size, size_t* d_sizes,
                int* d_status, cudaStream_t stream);

 private:
  struct Group {
    std::vector<tz_cuda_decompress_item> items;  // dst relative to `base`
    std::vector<uint64_t> offsets;
    std::vector<std::string> names;
    uint64_t bytes = 0;
    uint8_t* base = nullptr;  // destination the items' dst pointers point into
  };
  std::vector<Group> groups_;
  size_t temp_bytes_ = 0, max_frames_ = 0;
  bool final_ = false;
};

}  // namespace tz::resident

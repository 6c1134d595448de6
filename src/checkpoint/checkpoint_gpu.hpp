// GPU side of the checkpoint engine (built with the CUDA backend only;
// checkpoint_gpu.cpp): pinned staging memory reused across saves, batched
// GPU encode of device tensors feeding the container writer, and batched
// GPU decode of frames into device memory on restore, reading the frames
// through cuFile (GPUDirect Storage) where available.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorzip/tensorzip.h"

namespace tz::container {
class TensorWriter;
}

namespace tz::checkpoint::gpu {

int device_count();  // CUDA devices visible (0 on error)

// Pinned host memory (cudaHostAlloc) from a process-wide pool: buffers are
// kept and handed out again to later saves (no allocation per save).
void* pinned_get(size_t n);
void pinned_put(void* p);

// A chunk of a device tensor to encode.
struct DevChunk {
  const void* src = nullptr;  // device
  uint64_t n = 0;
  tz_dtype cd = TZ_DTYPE_BYTES;
  unsigned block_elems = 0;
  unsigned elem_size = 1;
  int device = -1;            // CUDA device holding src; -1: the current device
};

// Encodes device chunks on the GPU in batches (tz_cuda_compress, one call
// per batch of up to batch_bytes raw bytes), each batch's frames copied
// into a pinned buffer; encode(i) hands out chunk i's frame. At most two
// batches hold pinned memory at a time; a batch's buffer returns to the
// pool once all its frames were taken. Chunks the GPU codec does not take
// (TZ_DTYPE_BYTES, partial elements, level 3) are copied to the host and
// encoded on the CPU. A batch holds chunks of one device and one block size.
// Thread-safe; chunks should be asked for roughly in order.
class BatchEncoder {
 public:
  BatchEncoder(std::vector<DevChunk> chunks, int level, uint64_t batch_bytes = 256ull << 20);
  ~BatchEncoder();
  size_t encode(size_t i, uint8_t* dst, size_t cap);
  // Raw bytes of the chunks handed out so far: encoded on the GPU, and
  // copied to the host and encoded on the CPU.
  uint64_t gpu_bytes() const;
  uint64_t host_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Device tensors of one container TensorWriter, encoded on the GPU: the
// checkpoint engine's save and the Python binding (TensorWriter.add_cuda)
// both go through it. add() registers a tensor with the writer
// (TensorWriter::add_encoder, one frame per chunk_bytes chunk of the writer)
// and queues its chunks; once every tensor was added, start() builds the
// BatchEncoder that encodes the chunks of all tensors in batches across
// tensors, as the writer's workers ask for them. Must outlive the writer's
// finish().
class WriterEncoder {
 public:
  explicit WriterEncoder(int level);
  ~WriterEncoder();
  WriterEncoder(const WriterEncoder&) = delete;
  WriterEncoder& operator=(const WriterEncoder&) = delete;

  // `data`: `size` bytes of device (or managed) memory holding the tensor
  // (safetensors dtype, shape). It must stay valid and unchanged until the
  // writer's finish() returns, and work that writes it must be complete:
  // the GPU reads it on streams of its own. block_elems: codec block size,
  // 0 = the container default for the dtype (65536, or 262144 for bytes).
  // Throws tz::container::Error (kUsage) for a pointer that is not device
  // memory, no CUDA device, or a call after start().
  void add(tz::container::TensorWriter& w, const std::string& name, const std::string& dtype,
           const std::vector<uint64_t>& shape, const void* data, uint64_t size, unsigned block_elems);
  // Call once, after the last add() and before the writer's finish().
  void start();
  uint64_t gpu_bytes() const;   // raw bytes encoded on the GPU (after finish())
  uint64_t host_bytes() const;  // raw bytes the GPU codec does not take, encoded on the CPU

 private:
  int level_;
  std::vector<DevChunk> chunks_;
  std::unique_ptr<BatchEncoder> enc_;
};

// A frame to decode into device memory.
struct DevFrame {
  int fd = -1;            // buffered descriptor of its file
  int dfd = -1;           // O_DIRECT descriptor (GDS), or -1
  uint64_t offset = 0, size = 0, xxh64 = 0;
  void* dst = nullptr;    // device
  uint64_t raw_size = 0;
  std::string what;       // "tensor 'x' (file, frame at offset n)" for messages
};

// Reads and decodes the frames in batches: with `gds`, cuFileRead straight
// into device memory (the GPU decoder checks every block checksum); else
// pread into pinned buffers, xxh64 checked, one copy to the device. Decode:
// tz_cuda_decompress per batch; frames the GPU cannot take (zstd streams)
// are decoded on the CPU and copied. Throws std::runtime_error("corrupt: ...")
// naming the frame on damage, std::runtime_error otherwise.
void load_frames(std::vector<DevFrame>& frames, bool gds);

}  // namespace tz::checkpoint::gpu

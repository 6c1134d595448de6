// Checkpoint save from and restore into GPU memory (CUDA builds; every test
// skips without a CUDA device): batched GPU encode through pinned buffers,
// batched GPU decode, cast-predicted tensors into device memory, async saves
// of device tensors through the pinned staging arena, and Io::kGds (cuFile
// where present, the POSIX fallback otherwise). gpu::WriterEncoder (the GPU
// encode behind the checkpoint engine and the Python TensorWriter.add_cuda):
// files equal to the CPU writer's; its refusal of non-device memory runs
// without a device too.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "checkpoint_gpu.hpp"
#include "tz_test_files.hpp"
#include "tensorzip/checkpoint.hpp"
#include "tensorzip/container.hpp"

namespace fs = std::filesystem;
namespace ck = tz::checkpoint;

namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The fixture slices (tests/common) with a device copy of each tensor.
struct Owned : tz_test::Owned {
  void* dev = nullptr;
};

std::vector<Owned> load_fixture_slices() {
  std::vector<Owned> out;
  for (auto& o : tz_test::load_pair(std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-bf16.safetensors",
                                    std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-fp32.safetensors"))
    out.push_back({std::move(o)});
  return out;
}

// Restores tensor `name` (n bytes) into a fresh device buffer and returns
// the bytes copied back to the host (empty with a test failure on a CUDA error).
std::vector<uint8_t> load_to_device(ck::Checkpoint& c, const std::string& name, size_t n) {
  void* out = nullptr;
  if (cudaMalloc(&out, n ? n : 1) != cudaSuccess) {
    ADD_FAILURE() << "cudaMalloc failed";
    return {};
  }
  const ck::LoadRequest r{name, out, n, ck::Memory::kDevice};
  c.load(std::span<const ck::LoadRequest>(&r, 1));
  std::vector<uint8_t> back(n);
  if (cudaMemcpy(back.data(), out, n, cudaMemcpyDeviceToHost) != cudaSuccess) ADD_FAILURE() << "cudaMemcpy failed";
  cudaFree(out);
  return back;
}

using tz_test::TempDir;

}  // namespace

TEST(CheckpointGpu, DeviceSaveAndRestore) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto data = load_fixture_slices();
  data.push_back({{"ids", "I64", {6}, std::vector<uint8_t>(48, 5)}});  // not on the GPU codec: CPU path
  std::vector<ck::TensorView> v;
  for (auto& t : data) {
    ASSERT_EQ(cudaMalloc(&t.dev, t.bytes.size() ? t.bytes.size() : 1), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(t.dev, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    v.push_back({t.name, t.dtype, t.shape, t.dev, t.bytes.size(), ck::Memory::kDevice});
  }
  TempDir d;
  for (ck::Io io : {ck::Io::kAuto, ck::Io::kGds}) {
    for (bool async : {false, true}) {
      const std::string dir = d.path + "/c" + std::to_string((int)io) + (async ? "a" : "s");
      ck::SaveOptions o;
      o.codec = ck::Codec::kFast;
      o.io = io;
      o.chunk_bytes = 1u << 20;
      ck::SaveStats st;
      if (async) {
        ck::AsyncSaver s;
        s.save(dir, v, o);
        st = s.wait();
      } else {
        st = ck::save(dir, v, o);
      }
      RecordProperty("io_" + dir.substr(d.path.size() + 1), st.io);
      ck::Checkpoint c(dir, 2, false, io);
      for (const auto& t : data) {
        EXPECT_TRUE(c.read(t.name) == t.bytes) << t.name;  // host destination
        EXPECT_TRUE(load_to_device(c, t.name, t.bytes.size()) == t.bytes)
            << t.name << " (device destination, " << c.io() << ")";
      }
    }
  }
  // Host save with cast prediction, restored into device memory.
  {
    std::vector<ck::TensorView> hv;
    for (auto& t : data) hv.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
    ck::SaveOptions o;
    o.codec = ck::Codec::kFast;
    const auto st = ck::save(d.path + "/host", hv, o);
    RecordProperty("predicted", std::to_string(st.predicted));
    ck::Checkpoint c(d.path + "/host");
    for (const auto& t : data) {
      EXPECT_TRUE(load_to_device(c, t.name, t.bytes.size()) == t.bytes) << t.name;
    }
  }
  for (auto& t : data) cudaFree(t.dev);
}

// TensorWriter + gpu::WriterEncoder (device tensors, frames encoded on the
// GPU in batches across tensors) writes the same file, byte for byte, as the
// TensorWriter fed with the same tensors in host memory; the I64 tensor and
// level 3 (not taken by the GPU codec) go through the host-copy path.
TEST(CheckpointGpu, WriterEncoderFileEqualsCpuWriter) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto data = load_fixture_slices();
  data.push_back({{"ids", "I64", {6}, std::vector<uint8_t>(48, 5)}});
  uint64_t float_bytes = 0;
  for (auto& t : data) {
    ASSERT_EQ(cudaMalloc(&t.dev, t.bytes.size() ? t.bytes.size() : 1), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(t.dev, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    if (t.dtype != "I64") float_bytes += t.bytes.size();
  }
  TempDir d;
  for (int level : {1, 2, 3, -1}) {
    for (unsigned block_elems : {0u, 4096u}) {
      const std::string tag = std::to_string(level) + "_" + std::to_string(block_elems);
      tz::container::TensorWriterOptions o;
      o.level = level;
      o.block_elems = block_elems;
      o.chunk_bytes = 1u << 20;
      o.predict = false;
      tz::container::TensorWriter cpu(d.path + "/cpu" + tag + ".tzip", o);
      for (const auto& t : data) cpu.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
      cpu.finish();
      tz::container::TensorWriter gw(d.path + "/gpu" + tag + ".tzip", o);
      tz::checkpoint::gpu::WriterEncoder enc(level);
      for (const auto& t : data) enc.add(gw, t.name, t.dtype, t.shape, t.dev, t.bytes.size(), block_elems);
      enc.start();
      gw.finish();
      EXPECT_TRUE(tz_test::read_all(d.path + "/gpu" + tag + ".tzip") == tz_test::read_all(d.path + "/cpu" + tag + ".tzip"))
          << "level " << level << ", block_elems " << block_elems;
      if (level == 3) {
        EXPECT_EQ(enc.gpu_bytes(), 0u);
        EXPECT_EQ(enc.host_bytes(), float_bytes + 48);
      } else {
        EXPECT_EQ(enc.gpu_bytes(), float_bytes) << tag;
        EXPECT_EQ(enc.host_bytes(), 48u) << tag;
      }
    }
  }
  for (auto& t : data) cudaFree(t.dev);
}

// Host memory (or no device at all) is refused when the tensor is added,
// with a usage error naming the file and the tensor.
TEST(CheckpointGpu, WriterEncoderRefusesHostMemory) {
  TempDir d;
  std::vector<uint8_t> host(4096);
  tz::container::TensorWriter w(d.path + "/x.tzip");
  tz::checkpoint::gpu::WriterEncoder enc(1);
  try {
    enc.add(w, "h", "F32", {1024}, host.data(), host.size(), 0);
    FAIL() << "host memory accepted";
  } catch (const tz::container::Error& e) {
    EXPECT_EQ(e.kind(), tz::container::ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("x.tzip: tensor 'h'"), std::string::npos) << e.what();
  }
  // Nothing was added: the writer still works.
  w.add("k", "F32", {1024}, host.data(), host.size());
  enc.start();
  w.finish();
  EXPECT_EQ(tz::container::Reader(d.path + "/x.tzip").tensors().size(), 1u);
}

// Helpers shared by the checkpoint suites (test_checkpoint.cpp,
// test_checkpoint_failures.cpp, test_checkpoint_io.cpp): the committed
// slice of the real checkpoint, and the check that a checkpoint restores
// exactly the given tensors.
#pragma once
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "container/output.hpp"  // temporary names
#include "cufile.hpp"  // src/io: the GPUDirect Storage decision
#include "read_queue.hpp"
#include "uring_ring.hpp"  // src/io: io_uring fault injection
#include "tensorzip/checkpoint.hpp"
#include "tensorzip/container.hpp"
#include "tz_test_checkpoint.hpp"  // tests/support

namespace fs = std::filesystem;
namespace ck = tz::checkpoint;
using namespace tz_test;

namespace checkpoint_test {

inline std::vector<Owned> real_tensors() {
  return load_pair(std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-bf16.safetensors",
                   std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-fp32.safetensors");
}

inline void expect_identical(ck::Checkpoint& c, const std::vector<Owned>& ref) {
  ASSERT_EQ(c.tensors().size(), ref.size());
  for (const auto& o : ref) {
    const long i = c.find(o.name);
    ASSERT_GE(i, 0) << o.name;
    EXPECT_EQ(c.tensors()[(size_t)i].dtype, o.dtype);
    EXPECT_EQ(c.tensors()[(size_t)i].shape, o.shape);
    EXPECT_TRUE(c.read(o.name) == o.bytes) << o.name;
  }
}

}  // namespace checkpoint_test

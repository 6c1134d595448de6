// The CPU plan of resident weights (src/resident/plan.hpp):
// groups of real fixture weights (BF16 and their F16 / F32 / FP8 casts)
// decode byte for byte into their place in a group buffer, with any thread
// count and block size, synchronously and in the background; tasks are cut
// as documented; bad frames are refused when added and corrupt blocks are
// reported with the tensor named, leaving the plan usable; frames are
// prepared once (tables within the budget, counted), a corrupt block is still
// found with prepared tables, and a prepared frame's prefix is not read again.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "codec/format.h"
#include "resident/plan.hpp"
#include "tensorzip/tensorzip.h"
#include "tz_test_data.h"

namespace {

using tz::resident::ResidentDecodeError;
using tz::resident::ResidentFrameError;
using tz::resident::ResidentPlan;
using tzt::Bytes;

struct Weight {
  std::string name;
  Bytes raw;
  Bytes frame;
};

Bytes compress(const Bytes& raw, tz_dtype dt, unsigned block_elems) {
  tz_params p{};
  p.dtype = dt;
  p.block_elems = block_elems;
  Bytes out(tz_compress_bound(raw.size()));
  const size_t n = tz_compress(out.data(), out.size(), raw.data(), raw.size(), &p);
  EXPECT_FALSE(tz_is_error(n)) << tz_last_error_detail();
  out.resize(n);
  return out;
}

// The fixture slice's matrices as `dtype` (BF16 as stored, the others cast
// from those real values), compressed with blocks of `block_elems`.
std::vector<Weight> weights(tz_dtype dt, unsigned block_elems) {
  std::vector<Weight> out;
  for (const auto& t : tzt::bf16_slice()) {
    if (t.shape.size() < 2) continue;
    const std::vector<float> v = tzt::as_floats_bf16(t.data);
    Bytes raw;
    switch (dt) {
      case TZ_DTYPE_BF16: raw = t.data; break;
      case TZ_DTYPE_F16: raw = tzt::to_f16(v); break;
      case TZ_DTYPE_F8_E4M3: raw = tzt::to_f8_e4m3(v); break;
      case TZ_DTYPE_F8_E5M2: raw = tzt::to_f8_e5m2(v); break;
      default:
        raw.resize(v.size() * 4);
        memcpy(raw.data(), v.data(), raw.size());
    }
    out.push_back({t.name, raw, compress(raw, dt, block_elems)});
  }
  return out;
}

uint64_t aligned(uint64_t n) { return (n + 255) / 256 * 256; }

// Adds ws to `group` back to back (256-aligned); returns the offsets.
std::vector<uint64_t> add_group(ResidentPlan& plan, size_t group, const std::vector<Weight>& ws) {
  std::vector<uint64_t> off;
  uint64_t pos = 0;
  for (const auto& w : ws) {
    off.push_back(pos);
    EXPECT_EQ(plan.add(group, w.name, w.frame.data(), w.frame.size(), pos), w.raw.size());
    pos += aligned(w.raw.size());
  }
  return off;
}

void expect_group(const Bytes& buf, const std::vector<Weight>& ws, const std::vector<uint64_t>& off) {
  for (size_t i = 0; i < ws.size(); ++i)
    EXPECT_EQ(0, memcmp(buf.data() + off[i], ws[i].raw.data(), ws[i].raw.size())) << ws[i].name;
}

class EveryDtype : public ::testing::TestWithParam<tz_dtype> {};

TEST_P(EveryDtype, GroupsDecodeByteForByte) {
  for (unsigned block_elems : {4096u, 0u}) {
    const std::vector<Weight> ws = weights(GetParam(), block_elems);
    ASSERT_EQ(ws.size(), 3u);  // tok, qkv, proj
    for (unsigned threads : {1u, 2u, 3u}) {
      ResidentPlan plan(threads);
      EXPECT_EQ(plan.threads(), threads);
      // group 0: qkv + proj (one block's weights); group 1: tok; group 2: everything
      const std::vector<Weight> g0 = {ws[1], ws[2]}, g1 = {ws[0]};
      const auto o0 = add_group(plan, 0, g0);
      const auto o1 = add_group(plan, 1, g1);
      const auto o2 = add_group(plan, 2, ws);
      plan.finalize();
      ASSERT_EQ(plan.groups(), 3u);
      for (size_t g = 0; g < 3; ++g) {
        Bytes buf(plan.group_bytes(g), 0xEE);
        plan.decode(g, buf.data(), buf.size());
        expect_group(buf, g == 0 ? g0 : g == 1 ? g1 : ws, g == 0 ? o0 : g == 1 ? o1 : o2);
      }
      uint64_t expect = plan.group_bytes(0) + plan.group_bytes(1) + plan.group_bytes(2);
      // again, in the background, while the calling thread decodes another group into another buffer
      Bytes a(plan.group_bytes(2)), b(plan.group_bytes(0));
      plan.start(2, a.data(), a.size());
      plan.decode(0, b.data(), b.size());  // waits for the background decode first (one loop at a time)
      plan.wait();
      EXPECT_FALSE(plan.busy());
      expect_group(a, ws, o2);
      expect_group(b, g0, o0);
      expect += plan.group_bytes(2) + plan.group_bytes(0);
      EXPECT_EQ(plan.decoded_bytes(), expect);
      EXPECT_GT(plan.decode_seconds(), 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EveryDtype,
                         ::testing::Values(TZ_DTYPE_BF16, TZ_DTYPE_F16, TZ_DTYPE_F32, TZ_DTYPE_F8_E4M3,
                                           TZ_DTYPE_F8_E5M2),
                         [](const auto& info) { return std::string(tz_dtype_name(info.param)); });

TEST(ResidentPlan, TasksAreBlockRunsAboutFourPerWorker) {
  const std::vector<Weight> ws = weights(TZ_DTYPE_BF16, 4096);  // 16 + 48 + 16 blocks
  for (unsigned threads : {1u, 2u, 4u}) {
    ResidentPlan plan(threads);
    add_group(plan, 0, ws);
    plan.finalize();
    const uint64_t per = std::max<uint64_t>(1, 80 / (4 * threads));
    const uint64_t expect = (16 + per - 1) / per + (48 + per - 1) / per + (16 + per - 1) / per;
    EXPECT_EQ(plan.tasks(0), expect) << threads << " threads";
    EXPECT_EQ(plan.frames(0), 3u);
  }
}

TEST(ResidentPlan, BadFramesRefusedWhenAdded) {
  const std::vector<Weight> ws = weights(TZ_DTYPE_BF16, 0);
  ResidentPlan plan(1);
  Bytes f = ws[0].frame;
  try {
    plan.add(0, "tok.weight", f.data(), f.size() - 1, 0);  // size differs from the frame's
    FAIL() << "no error";
  } catch (const ResidentFrameError& e) {
    EXPECT_NE(std::string(e.what()).find("tok.weight"), std::string::npos) << e.what();
  }
  f[8] ^= 1;  // header (covered by the header CRC)
  EXPECT_THROW(plan.add(0, "tok.weight", f.data(), f.size(), 0), ResidentFrameError);
  EXPECT_THROW(plan.add(0, "x", nullptr, 100, 0), ResidentFrameError);
  const Bytes junk(200, 0x55);
  EXPECT_THROW(plan.add(0, "x", junk.data(), junk.size(), 0), ResidentFrameError);
  plan.finalize();
  EXPECT_THROW(plan.add(0, "late", ws[0].frame.data(), ws[0].frame.size(), 0), std::logic_error);
  EXPECT_THROW(plan.decode(7, nullptr, 0), std::out_of_range);
}

TEST(ResidentPlan, CorruptBlockNamesTensorAndPlanStaysUsable) {
  std::vector<Weight> ws = weights(TZ_DTYPE_BF16, 4096);
  Bytes bad = ws[1].frame;  // qkv: flip a byte late in the frame (block data, after the prefix)
  bad[bad.size() - 100] ^= 0x20;
  ResidentPlan plan(2);
  plan.add(0, ws[1].name, bad.data(), bad.size(), 0);
  const std::vector<Weight> tok = {ws[0]};  // the plan keeps pointers: the frames must outlive it
  add_group(plan, 1, tok);
  plan.finalize();
  Bytes buf(plan.group_bytes(0));
  try {
    plan.decode(0, buf.data(), buf.size());
    FAIL() << "no error";
  } catch (const ResidentDecodeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("blocks.2.qkv.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("block 47 of 48"), std::string::npos) << m;
  }
  plan.start(0, buf.data(), buf.size());
  EXPECT_THROW(plan.wait(), ResidentDecodeError);
  plan.wait();  // the error was reported once
  Bytes ok(plan.group_bytes(1));
  plan.decode(1, ok.data(), ok.size());
  EXPECT_EQ(0, memcmp(ok.data(), ws[0].raw.data(), ws[0].raw.size()));
  Bytes small(plan.group_bytes(1) - 1);
  EXPECT_THROW(plan.decode(1, small.data(), small.size()), std::invalid_argument);
}

// The same decode whether a frame's tables are prepared (within the budget)
// or built per call (past it); a frame in two groups is prepared once; the
// budget bounds prepared_bytes().
TEST(ResidentPlan, PreparedTablesWithinBudgetOthersPerCall) {
  const std::vector<Weight> ws = weights(TZ_DTYPE_BF16, 4096);
  uint64_t all_bytes = 0, first_bytes = 0;
  {
    ResidentPlan plan(2);
    add_group(plan, 0, ws);
    plan.add(1, ws[1].name, ws[1].frame.data(), ws[1].frame.size(), 0);  // the same frame again: prepared once
    plan.finalize();
    EXPECT_EQ(plan.prepared_frames(), 3u);
    // at least the decode table of each frame (4096 entries of 4 bytes) and its index copy
    EXPECT_GE(plan.prepared_bytes(), 3u * 16384u + 4u * (16 + 48 + 16));
    all_bytes = plan.prepared_bytes();
    Bytes buf(plan.group_bytes(1));
    plan.decode(1, buf.data(), buf.size());
    EXPECT_EQ(0, memcmp(buf.data(), ws[1].raw.data(), ws[1].raw.size()));
  }
  {
    ResidentPlan plan(1);
    plan.add(0, ws[0].name, ws[0].frame.data(), ws[0].frame.size(), 0);
    first_bytes = plan.prepared_bytes();
  }
  // budget for the first frame only (tok, 16 blocks): qkv (48 blocks) and proj (16) do not fit after it
  for (uint64_t budget : {uint64_t{0}, first_bytes, all_bytes}) {
    ResidentPlan plan(2, budget);
    const auto off = add_group(plan, 0, ws);
    plan.finalize();
    EXPECT_LE(plan.prepared_bytes(), budget);
    EXPECT_EQ(plan.prepared_frames(), budget == 0 ? 0u : budget == all_bytes ? 3u : 1u) << budget;
    Bytes buf(plan.group_bytes(0), 0xEE);
    plan.decode(0, buf.data(), buf.size());
    expect_group(buf, ws, off);
  }
}

// Block data corrupted after the frame was prepared is found by its block
// checksum on the next decode, with prepared tables as without them; the plan
// decodes again once the bytes are back.
TEST(ResidentPlan, CorruptBlockFoundWithPreparedTables) {
  const std::vector<Weight> ws = weights(TZ_DTYPE_BF16, 4096);
  for (uint64_t budget : {ResidentPlan::kDefaultTableBudget, uint64_t{0}}) {
    Bytes frame = ws[1].frame;
    ResidentPlan plan(2, budget);
    plan.add(0, ws[1].name, frame.data(), frame.size(), 0);
    plan.finalize();
    EXPECT_EQ(plan.prepared_frames(), budget ? 1u : 0u);
    Bytes buf(plan.group_bytes(0));
    plan.decode(0, buf.data(), buf.size());
    EXPECT_EQ(0, memcmp(buf.data(), ws[1].raw.data(), ws[1].raw.size()));
    const size_t at = frame.size() - 100;  // in the last block's data
    frame[at] ^= 0x20;
    try {
      plan.decode(0, buf.data(), buf.size());
      FAIL() << "no error, budget " << budget;
    } catch (const ResidentDecodeError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("blocks.2.qkv.weight"), std::string::npos) << m;
      EXPECT_NE(m.find("block 47 of 48"), std::string::npos) << m;
    }
    frame[at] ^= 0x20;
    plan.decode(0, buf.data(), buf.size());
    EXPECT_EQ(0, memcmp(buf.data(), ws[1].raw.data(), ws[1].raw.size()));
  }
}

// A prepared frame's prefix is read once, when added: the decode uses the
// tables and block index validated then, so prefix bytes overwritten later
// (frequencies, index) change nothing and cannot steer a read outside the
// frame. Without prepared tables the per-call check (header CRC) refuses them.
TEST(ResidentPlan, PreparedFramePrefixIsNotReadAgain) {
  const std::vector<Weight> ws = weights(TZ_DTYPE_BF16, 4096);
  tz_frame_info info{};
  ASSERT_FALSE(tz_is_error(tz_frame_inspect(ws[1].frame.data(), ws[1].frame.size(), &info)));
  for (uint64_t budget : {ResidentPlan::kDefaultTableBudget, uint64_t{0}}) {
    Bytes frame = ws[1].frame;
    ResidentPlan plan(1, budget);
    plan.add(0, ws[1].name, frame.data(), frame.size(), 0);
    plan.finalize();
    // everything after the fixed header up to the first block: tables and index
    for (size_t i = tz::kFrameHeaderSize; i < info.prefix_size; ++i) frame[i] = 0xFF;
    Bytes buf(plan.group_bytes(0));
    if (budget) {
      plan.decode(0, buf.data(), buf.size());
      EXPECT_EQ(0, memcmp(buf.data(), ws[1].raw.data(), ws[1].raw.size()));
    } else {
      EXPECT_THROW(plan.decode(0, buf.data(), buf.size()), ResidentDecodeError);
    }
  }
}

// decode_blocks: a run of one frame's blocks alone, byte for byte, with and
// without prepared tables; ranges outside the frame and short destinations
// refused.
TEST(ResidentPlan, DecodeBlocksOfOneFrame) {
  const std::vector<Weight> ws = weights(TZ_DTYPE_BF16, 4096);  // qkv: 48 blocks of 8 KiB
  for (uint64_t budget : {ResidentPlan::kDefaultTableBudget, uint64_t{0}}) {
    ResidentPlan plan(2, budget);
    add_group(plan, 0, ws);
    plan.finalize();
    Bytes out(3 * 8192, 0xEE);
    EXPECT_EQ(plan.decode_blocks(0, 1, 5, 3, out.data(), out.size()), out.size());
    EXPECT_EQ(0, memcmp(out.data(), ws[1].raw.data() + 5 * 8192, out.size())) << budget;
    EXPECT_THROW(plan.decode_blocks(0, 1, 46, 3, out.data(), out.size()), std::out_of_range);
    EXPECT_THROW(plan.decode_blocks(0, 3, 0, 1, out.data(), out.size()), std::out_of_range);
    EXPECT_THROW(plan.decode_blocks(0, 1, 5, 3, out.data(), out.size() - 1), std::invalid_argument);
  }
}

}  // namespace

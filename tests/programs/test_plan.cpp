// Cost model of `tzip plan` (programs/plan.hpp) and the save's codec choice
// (src/checkpoint/codec_choice.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "plan.hpp"

using namespace tz::checkpoint;

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

// The seed's worked example: a 70B model's checkpoint is ~782 GB (130 GB BF16
// weights + 521 GB FP32 optimizer state + 130 GB gradients); at 5 GB/s it
// takes ~156 s to write.
TEST(Plan, WorkedExample70B) {
  PlanInput in;
  in.parts = model_parts(70e9, /*master=*/false, /*grad_bytes_per_param=*/2);
  ASSERT_EQ(in.parts.size(), 4u);
  double weights = 0, optim = 0, grads = 0;
  for (const auto& p : in.parts) {
    if (p.label == "weights") weights += p.bytes / kGiB;
    else if (p.label == "gradients") grads += p.bytes / kGiB;
    else optim += p.bytes / kGiB;
  }
  EXPECT_NEAR(weights, 130, 1);
  EXPECT_NEAR(optim, 521, 1);
  EXPECT_NEAR(grads, 130, 1);
  in.storage_gibps = 5;
  apply_default_codec_figures(in);
  const PlanResult r = plan(in);
  EXPECT_NEAR(r.raw_bytes / kGiB, 782, 1);
  EXPECT_NEAR(r.sync_stall_raw_s, 156, 1);
  EXPECT_NEAR(r.restore_raw_s, 156, 1);
  // At 5 GiB/s the default codec figures make coding pay: a shorter stall,
  // and GPU-hours saved = saves per month (every 30 min, 730 h) x the stall
  // saved x 64 GPUs.
  EXPECT_NE(r.choice.kind, CodecKind::kRaw);
  EXPECT_LT(r.sync_stall_comp_s, r.sync_stall_raw_s - 1);
  EXPECT_NEAR(r.checkpoints_per_month, 8760.0 / 12 * 2, 1e-9);
  EXPECT_NEAR(r.gpu_hours_saved_sync, 8760.0 / 12 * 2 * (r.sync_stall_raw_s - r.sync_stall_comp_s) * 64 / 3600, 1e-6);
  EXPECT_GT(r.gpu_hours_saved_sync, 100);
}

TEST(Plan, ModelPartsMasterAndGradients) {
  double total = 0;
  for (const auto& p : model_parts(1e9, true, 4)) total += (double)p.bytes;
  EXPECT_DOUBLE_EQ(total, 1e9 * (2 + 4 + 4 + 4 + 4));
  total = 0;
  for (const auto& p : model_parts(1e9, false, 0)) total += (double)p.bytes;
  EXPECT_DOUBLE_EQ(total, 1e9 * 10);
}

TEST(Plan, CodecChoiceNeverSlowerThanRaw) {
  const double S = 100 * kGiB;
  // Slow encoder, fast storage: raw.
  CodecChoice c = choose_codec(S, 10, 1, 1.5, 0.5, 1.6);
  EXPECT_EQ(c.kind, CodecKind::kRaw);
  EXPECT_NEAR(c.t_raw_s, 10, 1e-9);
  EXPECT_NEAR(c.t_fast_s, 100, 1e-9);
  // Fast encoder, slow storage: compressed time = S / (r B).
  c = choose_codec(S, 1, 50, 1.5, 40, 1.6);
  EXPECT_EQ(c.kind, CodecKind::kStrong);
  EXPECT_NEAR(c.t_strong_s, 100 / 1.6, 1e-9);
  EXPECT_LT(c.t_strong_s, c.t_raw_s);
  // Strong encoder too slow to pay for its extra ratio: fast.
  c = choose_codec(S, 1, 50, 1.5, 0.9, 1.6);
  EXPECT_EQ(c.kind, CodecKind::kFast);
  // A tie with raw stays raw (compression must be strictly faster).
  c = choose_codec(S, 1, 1, 2.0, 0, 0);
  EXPECT_EQ(c.kind, CodecKind::kRaw);
  EXPECT_TRUE(std::isinf(c.t_strong_s));
  // Forced choice keeps the model.
  const CodecKind f = CodecKind::kFast;
  c = choose_codec(S, 10, 1, 1.5, 0.5, 1.6, &f);
  EXPECT_EQ(c.kind, CodecKind::kFast);
  EXPECT_NE(c.model.find("forced"), std::string::npos);
  EXPECT_NE(c.model.find("S/B"), std::string::npos);
}

TEST(Plan, SavingsArithmetic) {
  PlanInput in;
  in.parts = {{"weights", "BF16", (uint64_t)(100 * kGiB), 2.0, 2.0}};
  in.gpus = 10;
  in.storage_gibps = 1;
  in.fast = {100, 100};  // per GPU: encode is never the bottleneck
  in.strong = {0, 0};
  in.interval_min = 60;
  in.usd_per_gpu_hour = 3;
  in.usd_per_tib_month = 10;
  in.retained = 2;
  in.snapshot_gibps = 10;
  const PlanResult r = plan(in);
  EXPECT_EQ(r.choice.kind, CodecKind::kFast);
  EXPECT_NEAR(r.sync_stall_raw_s, 100, 1e-6);
  EXPECT_NEAR(r.sync_stall_comp_s, 50, 1e-6);
  EXPECT_NEAR(r.checkpoints_per_month, 730, 1e-9);
  EXPECT_NEAR(r.gpu_hours_saved_sync, 730 * 50 * 10 / 3600.0, 1e-6);
  EXPECT_NEAR(r.usd_saved_sync, r.gpu_hours_saved_sync * 3, 1e-6);
  // Async: snapshot 100 GiB / (10 x 10 GiB/s) = 1 s, no overrun of a 1 h interval.
  EXPECT_NEAR(r.async_stall_raw_s, 1, 1e-9);
  EXPECT_NEAR(r.async_stall_comp_s, 1, 1e-9);
  EXPECT_NEAR(r.storage_saved_tib, 50.0 * 2 / 1024, 1e-9);
  EXPECT_NEAR(r.usd_storage_saved, r.storage_saved_tib * 10, 1e-9);
  const auto j = nlohmann::json::parse(plan_json(in, r));
  EXPECT_EQ(j["codec"], "fast");
  EXPECT_NEAR(j["sync_stall_raw_s"].get<double>(), 100, 1e-6);
  EXPECT_FALSE(plan_report(in, r).empty());
}

TEST(Plan, PartsFromRealCheckpoint) {
  const std::string f = std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-fp32.safetensors";
  const auto parts = parts_from_checkpoint(f);
  ASSERT_FALSE(parts.empty());
  uint64_t total = 0;
  for (const auto& p : parts) total += p.bytes;
  EXPECT_GT(total, 700000u);
  EXPECT_LT(total, 812248u);
  PlanInput in;
  in.parts = parts;
  measure_codec(f, in, 1, 1u << 20);
  for (const auto& p : in.parts) {
    EXPECT_GT(p.ratio_fast, 1.0) << p.label;
    EXPECT_GT(p.ratio_strong, 1.0) << p.label;
  }
  EXPECT_GT(in.fast.compress_gibps, 0);
  EXPECT_GT(in.fast.decompress_gibps, 0);
}

// TensorWriter (container.hpp) with predictions (doc/container.md section
// 12): cast prediction on the real fixture, delta prediction against a
// previous file.

#include "tensor_writer_fixture.hpp"

using namespace tensor_writer_test;

// Mixed-precision checkpoint: BF16 weights are RNE casts of the FP32
// masters. Cast prediction finds them; exact and perturbed masters round
// trip byte-identically.
TEST(TensorWriter, CastPredictionOnFixture) {
  const std::string fx = TZ_SHARED_FIXTURES_DIR;
  if (!fs::exists(fx + "/gpt-small-step400-model-bf16.safetensors")) GTEST_SKIP() << "no shared fixtures";
  auto model = load_safetensors(fx + "/gpt-small-step400-model-bf16.safetensors");
  auto optim = load_safetensors(fx + "/gpt-small-step400-optim-fp32.safetensors");
  std::vector<Owned> all = model;
  all.insert(all.end(), optim.begin(), optim.end());
  uint64_t raw = 0;
  for (const auto& t : all) raw += t.bytes.size();
  TempDir d;
  auto write = [&](const std::vector<Owned>& v, bool predict, const std::string& name) {
    tc::TensorWriterOptions o;
    o.predict = predict;
    o.threads = 2;
    o.chunk_bytes = 1u << 20;
    tc::TensorWriter w(d.path + "/" + name, o);
    for (const auto& t : v) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    return w.finish();
  };
  const auto plain = write(all, false, "plain.tzip");
  const auto pred = write(all, true, "pred.tzip");
  EXPECT_EQ(plain.predicted, 0u);
  EXPECT_EQ(pred.predicted, model.size());  // every BF16 weight is a cast of its master
  EXPECT_LT(pred.file_bytes + raw / 200, plain.file_bytes);
  {
    tc::Reader r(d.path + "/pred.tzip", 1);
    EXPECT_EQ(r.version_major(), tc::kTzipVersionMajorPredicted);
    const auto& t = r.tensors()[(size_t)r.find(model[0].name)];
    EXPECT_EQ(t.predict.kind, tc::PredictKind::kCast);
    EXPECT_EQ(t.predict.source, "master." + model[0].name);
  }
  expect_file_holds(d.path + "/pred.tzip", all);
  // Perturbed masters: one element in 97 moved by a few ulps, so the casts
  // are right almost everywhere but not exactly.
  for (auto& t : all)
    if (t.name.rfind("master.", 0) == 0)
      for (size_t i = 0; i < t.bytes.size(); i += 4 * 97) t.bytes[i + 2] ^= 0x01;
  const auto pert = write(all, true, "pert.tzip");
  EXPECT_GT(pert.predicted, 0u);
  expect_file_holds(d.path + "/pert.tzip", all);
}

// Delta prediction (TensorWriterOptions::ref): tensors of the same name,
// dtype and shape as in a previous file are stored as XOR residuals where
// the sample says it pays; unchanged chunks become empty frames; the file
// records the reference by relative path + checksum, and every reader (the
// library, `tzip verify` / `decompress`) resolves it.
TEST(TensorWriter, DeltaAgainstPreviousFile) {
  const auto a = mixed_tensors();
  auto b = a;
  for (auto& t : b)
    if (t.name == "big.f32") {
      for (size_t i = 0; i < (1u << 20); i += 4 * 16) t.bytes[i] ^= 0x05;  // first chunk only
    } else if (t.name.rfind("opt.master.", 0) == 0) {
      for (size_t i = 0; i < t.bytes.size(); i += 4 * 16) t.bytes[i] ^= 0x01;
    }
  TempDir d;
  fs::create_directories(d.path + "/prev");
  fs::create_directories(d.path + "/next");
  auto write = [&](const std::vector<Owned>& v, const std::string& path, const std::string& ref) {
    tc::TensorWriterOptions o;
    o.threads = 2;
    o.chunk_bytes = 1u << 20;
    o.ref = ref;
    tc::TensorWriter w(path, o);
    for (const auto& t : v) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    return w.finish();
  };
  const auto sa = write(a, d.path + "/prev/r.tzip", "");
  EXPECT_EQ(sa.deltas, 0u);
  const auto plain = write(b, d.path + "/next/plain.tzip", "");
  const auto sb = write(b, d.path + "/next/r.tzip", d.path + "/prev/r.tzip");
  EXPECT_GT(sb.deltas, 0u);
  EXPECT_LT(sb.file_bytes, plain.file_bytes);
  {
    tc::Reader r(d.path + "/next/r.tzip", 1);
    EXPECT_EQ(r.version_major(), tc::kTzipVersionMajorPredicted);
    ASSERT_EQ(r.references().size(), 1u);
    EXPECT_EQ(r.references()[0].file, "../prev/r.tzip");
    EXPECT_EQ(r.references()[0].xxh64, sa.file_xxh64);
    const auto& big = r.tensors()[(size_t)r.find("big.f32")];
    EXPECT_EQ(big.predict.kind, tc::PredictKind::kDelta);
    ASSERT_EQ(big.frames.size(), 3u);
    EXPECT_GT(big.frames[0].size, 0u);
    EXPECT_EQ(big.frames[1].size, 0u);  // unchanged chunks: empty frames
    EXPECT_EQ(big.frames[2].size, 0u);
  }
  expect_file_holds(d.path + "/next/r.tzip", b);
  // A missing reference is refused by name.
  EXPECT_THROW(write(b, d.path + "/next/x.tzip", d.path + "/nope.tzip"), tc::Error);
  EXPECT_FALSE(fs::exists(d.path + "/next/x.tzip"));

  // ref_original: the predictors read from the reference's safetensors export instead of
  // decoded: the same file, byte for byte; a file of other content is refused (not safetensors:
  // at once; other bytes: by the reference's block checksums), and nothing is written.
  const std::string orig = d.path + "/prev/r.safetensors";
  tc::Reader(d.path + "/prev/r.tzip", 1).export_safetensors(orig, tc::ReadOptions{});
  auto write_orig = [&](const std::string& path, const std::string& ref_original) {
    tc::TensorWriterOptions o;
    o.threads = 2;
    o.chunk_bytes = 1u << 20;
    o.ref = d.path + "/prev/r.tzip";
    o.ref_original = ref_original;
    tc::TensorWriter w(path, o);
    for (const auto& t : b) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    return w.finish();
  };
  write_orig(d.path + "/next/o.tzip", orig);
  EXPECT_EQ(slurp(d.path + "/next/o.tzip"), slurp(d.path + "/next/r.tzip"));
  std::string bytes = slurp(orig);
  const auto info = tc::read_safetensors_info(orig);
  uint64_t big_at = 0;
  for (const auto& t : info.tensors)
    if (t.name == "big.f32") big_at = info.data_start + t.data_begin;
  ASSERT_GT(big_at, 0u);
  bytes[big_at + (2u << 20) + 12] ^= 0x40;  // in big.f32's third chunk (a delta, read from the original)
  const std::string other = d.path + "/prev/other.safetensors";
  write_all(other, Bytes(bytes.begin(), bytes.end()));
  const std::string short_one = d.path + "/prev/short.safetensors";
  write_all(short_one, Bytes(bytes.begin(), bytes.end() - 1));
  for (const std::string& bad : {short_one, other}) {
    try {
      write_orig(d.path + "/next/bad.tzip", bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const tc::Error& e) {
      // the short file is not a valid safetensors file at all (kBadInput); the other one is,
      // with the reference's header and size, but its bytes differ (kUsage)
      EXPECT_EQ(e.kind(), bad == other ? tc::ErrorKind::kUsage : tc::ErrorKind::kBadInput) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
      if (bad == other) {
        EXPECT_NE(std::string(e.what()).find("differs from"), std::string::npos) << e.what();
      }
    }
    EXPECT_FALSE(fs::exists(d.path + "/next/bad.tzip"));
  }
}

// compress_checkpoint: all outputs or none (doc/container.md section 12):
// a failing second input, cancellation, existing outputs and force, a
// full disk.

#include "predict_fixture.hpp"

using namespace predict_test;

// ---- compress_checkpoint: all outputs or none --------------------------------

namespace {
std::vector<std::string> list_dir(const std::string& d) {
  std::vector<std::string> v;
  if (DIR* dp = opendir(d.c_str())) {
    while (dirent* e = readdir(dp)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") v.push_back(n);
    }
    closedir(dp);
  }
  std::sort(v.begin(), v.end());
  return v;
}
// A two-file checkpoint: FP32 master (optim) and its BF16 cast (model).
void write_ckpt(const std::string& optim, const std::string& model, size_t n, uint32_t seed) {
  const Bytes m = normal_f32(n, 0.02f, seed);
  std::string shape = std::to_string(n);  // (not "[" + ...: GCC 12 -Wrestrict false positive)
  shape.insert(0, 1, '[');
  shape.push_back(']');
  write_st(optim, {{"opt.master", "F32", shape, m}});
  write_st(model, {{"model.w", "BF16", shape, cast_of(m, tp::kCastBF16)}});
}
}  // namespace

TEST_F(Predict, CompressCheckpointFailureOfSecondInputLeavesNothing) {
  mkdir(p("in").c_str(), 0755);
  mkdir(p("out").c_str(), 0755);
  write_ckpt(p("in/optim.safetensors"), p("in/model.safetensors"), 100000, 1);
  // The model file is written second (it holds BF16 tensors): damage it so
  // that its header parses but its data is short.
  Bytes bad = read_all(p("in/model.safetensors"));
  write_all(p("in/bad.safetensors"), Bytes(bad.begin(), bad.end() - 1000));
  const std::vector<std::string> ins = {p("in/bad.safetensors"), p("in/optim.safetensors")};
  const std::vector<std::string> outs = {p("out/model.tzip"), p("out/optim.tzip")};
  tc::WriteOptions o;
  o.threads = 2;
  try {
    tc::compress_checkpoint(ins, outs, o);
    FAIL() << "a truncated input must fail";
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(list_dir(p("out")).empty());

  // The 2nd file fails only once the 1st is complete: its previous
  // checkpoint (--ref) is not a .tzip file.
  write_all(p("in/garbage.tzip"), Bytes(4096, 7));
  try {
    tc::compress_checkpoint({p("in/model.safetensors"), p("in/optim.safetensors")}, outs, o,
                            {p("in/garbage.tzip"), ""});
    FAIL() << "a bad reference for the 2nd file must fail";
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("garbage.tzip"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(list_dir(p("out")).empty());
  // A folder given as an input: refused before any work.
  mkdir(p("in/dir.safetensors").c_str(), 0755);
  EXPECT_THROW(tc::compress_checkpoint({p("in/optim.safetensors"), p("in/dir.safetensors")}, outs, o), tc::Error);
  EXPECT_TRUE(list_dir(p("out")).empty());
}

TEST_F(Predict, CompressCheckpointCancelDuringSecondFileRemovesFirstOutput) {
  mkdir(p("out").c_str(), 0755);
  write_ckpt(p("optim.safetensors"), p("model.safetensors"), 1u << 20, 2);  // 4 MiB + 2 MiB
  const std::vector<std::string> ins = {p("model.safetensors"), p("optim.safetensors")};
  const std::vector<std::string> outs = {p("out/model.tzip"), p("out/optim.tzip")};
  tc::WriteOptions o;
  o.threads = 2;
  o.chunk_bytes = 1u << 20;
  int finished = 0;
  bool cancelled = false;
  o.progress = [&](uint64_t done, uint64_t total) {
    if (done == total) ++finished;
    // The optim file goes first (no BF16 tensors); cancel once the model
    // file (2nd) has started, i.e. after the 1st finished.
    if (finished == 1 && done < total && !cancelled) {
      cancelled = true;
      tc::request_cancel();
    }
  };
  try {
    tc::compress_checkpoint(ins, outs, o);
    tc::clear_cancel();
    FAIL() << "cancel must stop the call";
  } catch (const tc::Error& e) {
    tc::clear_cancel();
    EXPECT_EQ(e.kind(), tc::ErrorKind::kInterrupted) << e.what();
  }
  EXPECT_TRUE(cancelled);
  EXPECT_TRUE(list_dir(p("out")).empty());
  // And without the cancel both appear.
  o.progress = nullptr;
  tc::compress_checkpoint(ins, outs, o);
  EXPECT_EQ(list_dir(p("out")), (std::vector<std::string>{"model.tzip", "optim.tzip"}));
}

TEST_F(Predict, CompressCheckpointExistingOutputsAndForce) {
  mkdir(p("out").c_str(), 0755);
  write_ckpt(p("optim.safetensors"), p("model.safetensors"), 50000, 3);
  const std::vector<std::string> ins = {p("model.safetensors"), p("optim.safetensors")};
  const std::vector<std::string> outs = {p("out/model.tzip"), p("out/optim.tzip")};
  write_all(p("out/model.tzip"), Bytes{'o', 'l', 'd'});
  tc::WriteOptions o;
  try {
    tc::compress_checkpoint(ins, outs, o);
    FAIL() << "an existing output must be refused";
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kExists) << e.what();
  }
  EXPECT_EQ(list_dir(p("out")), std::vector<std::string>{"model.tzip"});
  EXPECT_EQ(read_all(p("out/model.tzip")), (Bytes{'o', 'l', 'd'}));
  // With force, a failing 2nd input puts the replaced file back.
  o.force = true;
  mkdir(p("bad.safetensors").c_str(), 0755);
  EXPECT_THROW(tc::compress_checkpoint({p("optim.safetensors"), p("bad.safetensors")}, outs, o), tc::Error);
  EXPECT_EQ(list_dir(p("out")), std::vector<std::string>{"model.tzip"});
  EXPECT_EQ(read_all(p("out/model.tzip")), (Bytes{'o', 'l', 'd'}));
  tc::compress_checkpoint(ins, outs, o);
  EXPECT_EQ(list_dir(p("out")), (std::vector<std::string>{"model.tzip", "optim.tzip"}));
  roundtrip(p("out/model.tzip"), p("model.safetensors"));
  // The cast across files is recorded by the final name, not a temporary one.
  tc::Reader r(p("out/model.tzip"));
  ASSERT_EQ(r.references().size(), 1u);
  EXPECT_EQ(r.references()[0].file, "optim.tzip");
  // An output that is an input, or two inputs to one output: refused.
  EXPECT_THROW(tc::compress_checkpoint(ins, {p("out/x.tzip"), p("out/x.tzip")}, o), tc::Error);
  EXPECT_THROW(tc::compress_checkpoint(ins, {p("model.safetensors"), p("out/y.tzip")}, o), tc::Error);
  EXPECT_EQ(list_dir(p("out")), (std::vector<std::string>{"model.tzip", "optim.tzip"}));
}

TEST_F(Predict, CompressCheckpointDiskFullLeavesNothing) {
  // A file size limit makes writes fail with EFBIG, as a full disk does
  // with ENOSPC: the 1st output fits, the 2nd does not.
  mkdir(p("out").c_str(), 0755);
  write_st(p("small.safetensors"), {{"a", "F32", "[1000]", normal_f32(1000, 1.f, 4)}});
  std::mt19937 g(5);
  Bytes noise(8u << 20);
  for (auto& b : noise) b = (uint8_t)g();
  write_st(p("big.safetensors"), {{"b", "U8", "[" + std::to_string(noise.size()) + "]", noise}});
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 4u << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  tc::WriteOptions o;
  o.level = -1;
  bool threw = false;
  std::string msg;
  try {
    tc::compress_checkpoint({p("small.safetensors"), p("big.safetensors")}, {p("out/small.tzip"), p("out/big.tzip")}, o);
  } catch (const tc::Error& e) {
    threw = true;
    msg = e.what();
    EXPECT_EQ(e.kind(), tc::ErrorKind::kIO) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_NE(msg.find("big.tzip"), std::string::npos) << msg;
  EXPECT_TRUE(list_dir(p("out")).empty());
}

// Checkpoint save/restore: round trips on real tensors, the rank file as a
// valid .tzip, unpredictable temporaries, async saves, partial loads,
// corruption naming the tensor, multi-rank commits, cast prediction on the
// fixture. Failures (io_uring faults, ENOSPC, kill -9):
// test_checkpoint_failures.cpp; O_DIRECT and GPUDirect Storage back ends:
// test_checkpoint_io.cpp.
#include "checkpoint_fixture.hpp"

using namespace checkpoint_test;

class RoundTrip : public ::testing::TestWithParam<std::tuple<ck::Codec, ck::Io>> {};

TEST_P(RoundTrip, RealTensorsByteIdentical) {
  const auto data = real_tensors();
  const auto v = views(data);
  TempDir d;
  ck::SaveOptions o;
  o.codec = std::get<0>(GetParam());
  o.io = std::get<1>(GetParam());
  o.storage_gibps = 1e-4;  // kAuto: storage so slow that compression pays even under sanitizers
  o.threads = 2;
  o.chunk_bytes = 1u << 20;
  o.slots = 3;  // fewer slots than chunks: buffers are reused
  o.metadata = {{"step", "400"}};
  std::string logged;
  o.log = [&](const std::string& s) { logged += s; };
  const std::string dir = d.path + "/step-400";
  const auto st = ck::save(dir, v, o);
  EXPECT_GT(st.raw_bytes, 1000000u);
  if (o.io == ck::Io::kPosix) {
    EXPECT_EQ(st.io, "posix");
  }
  RecordProperty("io", st.io);
  EXPECT_NE(logged.find("codec"), std::string::npos);
  if (o.codec == ck::Codec::kAuto) {
    EXPECT_NE(st.codec, "raw") << st.model;
  }
  if (o.codec != ck::Codec::kRaw) {
    EXPECT_LT(st.file_bytes, st.raw_bytes);
  }
  EXPECT_TRUE(ck::is_complete(dir));
  ck::Checkpoint c(dir, 2);
  EXPECT_EQ(c.metadata().at("step"), "400");
  expect_identical(c, data);
  ck::Checkpoint cd(dir, 2, /*direct_io=*/true);
  expect_identical(cd, data);
  RecordProperty("direct_io", cd.direct_io() ? "yes" : "no (refused by the file system)");
  EXPECT_FALSE(ck::Checkpoint(dir, 2).direct_io());
  EXPECT_TRUE(c.verify().empty());

  // The rank file is a valid .tzip container: the container library verifies
  // it and reads the same bytes back.
  tz::container::Reader rd(dir + "/rank-00000.tzip", 1);
  tz::container::ReadOptions ro;
  ro.threads = 1;
  rd.verify("", ro);
  for (const auto& t : data) EXPECT_TRUE(rd.read_tensor(t.name) == t.bytes) << t.name;
}

INSTANTIATE_TEST_SUITE_P(Codecs, RoundTrip,
                         ::testing::Combine(::testing::Values(ck::Codec::kRaw, ck::Codec::kFast, ck::Codec::kStrong,
                                                              ck::Codec::kAuto),
                                            ::testing::Values(ck::Io::kPosix, ck::Io::kUring)));

TEST(Checkpoint, AutoPicksRawOnFastStorage) {
  const auto data = real_tensors();
  TempDir d;
  ck::SaveOptions o;
  o.storage_gibps = 1e6;  // no codec keeps up with this
  const auto st = ck::save(d.path + "/c", views(data), o);
  EXPECT_EQ(st.codec, "raw");
  EXPECT_NE(st.model.find("S/B"), std::string::npos);
  ck::Checkpoint c(d.path + "/c");
  expect_identical(c, data);
}

// Issue 13 item 8: the manifest's and the bandwidth probe's temporaries are
// the container's (src/container/output.hpp): unpredictable names,
// created O_EXCL|O_NOFOLLOW. Links planted at the names they used to have
// (".manifest.json.tmp-PID", ".bw-probe-PID") are neither followed nor
// renamed onto manifest.json; every temporary a save creates (watched with
// inotify) is ".NAME.tmp-TAG-PID-<16 hex>", differs from save to save, and
// none is left behind, nor those of a killed save (a process that ended).
TEST(Checkpoint, TemporariesAreUnpredictableAndNeverFollowLinks) {
  const auto data = real_tensors();
  TempDir d;
  const pid_t dead = ::fork();  // a pid that has ended, for the temporaries a kill -9 leaves
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  auto left_by = [](const std::string& final_path, pid_t p) {
    std::string n = tz::container::detail::make_temp_name(final_path);
    const std::string mine = "-" + std::to_string(::getpid()) + "-";
    return n.replace(n.rfind(mine), mine.size(), "-" + std::to_string(p) + "-");
  };
  const std::string victim = d.path + "/victim", created = d.path + "/created-through-a-link";
  std::ofstream(victim) << "precious";
  const std::string pid = std::to_string(::getpid());
  std::vector<std::string> planted;
  std::set<std::string> temporaries[2];
  for (int k = 0; k < 2; ++k) {
    // Parents of their own: the probe's result is cached per parent folder.
    const std::string parent = d.path + "/p" + std::to_string(k), dir = parent + "/c";
    ASSERT_EQ(::mkdir(parent.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    const std::string links[] = {"/.manifest.json.tmp-" + pid, "/.bw-probe-" + pid};
    ASSERT_EQ(::symlink(victim.c_str(), (dir + links[0]).c_str()), 0);
    ASSERT_EQ(::symlink(created.c_str(), (dir + links[1]).c_str()), 0);  // dangling: O_CREAT would create `created`
    const std::string stale[] = {left_by(dir + "/manifest.json", dead), left_by(dir + "/bw-probe", dead)};
    for (const auto& f : stale) std::ofstream(f) << "left by a killed save";
    const int in = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    ASSERT_GE(in, 0);
    ASSERT_GE(::inotify_add_watch(in, dir.c_str(), IN_CREATE), 0);
    ck::SaveOptions o;  // kAuto without storage_gibps: the bandwidth probe runs in dir
    o.threads = 1;
    ck::save(dir, views(data), o);
    alignas(struct inotify_event) char buf[1 << 16];
    for (ssize_t n; (n = ::read(in, buf, sizeof buf)) > 0;)
      for (char* q = buf; q < buf + n;) {
        const auto* ev = reinterpret_cast<const struct inotify_event*>(q);
        if (ev->len && ev->name[0] == '.') temporaries[k].insert(ev->name);
        q += sizeof(struct inotify_event) + ev->len;
      }
    ::close(in);
    std::string content;
    std::getline(std::ifstream(victim), content);
    EXPECT_EQ(content, "precious");
    EXPECT_FALSE(fs::exists(created));
    EXPECT_FALSE(fs::is_symlink(dir + "/manifest.json"));
    for (const auto& l : links) {
      EXPECT_TRUE(fs::is_symlink(dir + l)) << l;
      temporaries[k].erase(l.substr(1));
    }
    std::set<std::string> left;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string()[0] == '.') left.insert(e.path().filename().string());
    EXPECT_EQ(left.size(), 2u) << "a temporary was left behind";
    for (const auto& f : stale) EXPECT_FALSE(fs::exists(f)) << f;
    ck::Checkpoint c(dir);
    expect_identical(c, data);
    const std::regex form("\\.(manifest\\.json|bw-probe|rank-00000\\.tzip)\\.tmp-.+-" + pid + "-[0-9a-f]{16}");
    bool manifest = false, probe = false;
    for (const auto& t : temporaries[k]) {
      EXPECT_TRUE(std::regex_match(t, form)) << t;
      manifest |= t.rfind(".manifest.json.tmp-", 0) == 0;
      probe |= t.rfind(".bw-probe.tmp-", 0) == 0;
    }
    EXPECT_TRUE(manifest && probe) << "the save's temporaries were not seen";
  }
  for (const auto& t : temporaries[0]) EXPECT_EQ(temporaries[1].count(t), 0u) << t << " in both saves";
}

TEST(Checkpoint, SharedFixtureRoundTrip) {
  const std::string fx = TZ_SHARED_FIXTURES_DIR;
  const std::string m = fx + "/gpt-small-step400-model-bf16.safetensors";
  const std::string op = fx + "/gpt-small-step400-optim-fp32.safetensors";
  if (!fs::exists(m) || !fs::exists(op)) GTEST_SKIP() << "no shared fixtures at " << fx;
  auto data = load_safetensors(m, "model.");
  auto b = load_safetensors(op, "optim.");
  data.insert(data.end(), std::make_move_iterator(b.begin()), std::make_move_iterator(b.end()));
  TempDir d;
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  const auto st = ck::save(d.path + "/c", views(data), o);
  EXPECT_LT(st.file_bytes, st.raw_bytes);
  ck::Checkpoint c(d.path + "/c");
  expect_identical(c, data);
}

TEST(Checkpoint, AsyncSaveStagesThenWrites) {
  auto data = real_tensors();
  TempDir d;
  ck::AsyncSaver s;
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  auto v = views(data);
  s.save(d.path + "/a", v, o);
  // The tensors were copied before save() returned: clobbering them now
  // must not change the checkpoint.
  auto ref = data;
  for (auto& t : data) std::fill(t.bytes.begin(), t.bytes.end(), 0xAB);
  const auto st = s.wait();
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.error(), nullptr);
  EXPECT_LE(st.stall_seconds, st.seconds);
  ck::Checkpoint c(d.path + "/a");
  expect_identical(c, ref);
  // A second save through the same saver (staging reused).
  s.save(d.path + "/b", views(ref), o);
  s.wait();
  ck::Checkpoint c2(d.path + "/b");
  expect_identical(c2, ref);
}

TEST(Checkpoint, AsyncSaveReportsErrors) {
  auto data = real_tensors();
  TempDir d;
  ck::AsyncSaver s;
  ck::save(d.path + "/a", views(data));
  s.save(d.path + "/a", views(data));  // already complete: refused
  EXPECT_THROW(s.wait(), ck::Error);
  EXPECT_NE(s.error(), nullptr);
}

// A background save that fails is reported even if nobody waited for it:
// the next save() throws it (naming that save) and starts nothing; after
// that, saves work again. wait() reports it too, and then it is not
// reported a second time by save().
TEST(Checkpoint, AsyncSaveFailureIsReportedByTheNextSave) {
  auto data = real_tensors();
  TempDir d;
  ck::save(d.path + "/a", views(data));
  std::vector<std::string> log;
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  o.log = [&log](const std::string& s) { log.push_back(s); };
  {
    ck::AsyncSaver s;
    s.save(d.path + "/a", views(data), o);  // already complete: fails in the background
    while (!s.done()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    try {
      s.save(d.path + "/b", views(data), o);
      ADD_FAILURE() << "the failed save was not reported";
    } catch (const ck::Error& e) {
      EXPECT_EQ(e.kind(), ck::ErrorKind::kUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find("previous asynchronous save to " + d.path + "/a"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(fs::exists(d.path + "/b"));  // nothing was started
    s.save(d.path + "/b", views(data), o);    // reported once: now it saves
    s.wait();
    EXPECT_TRUE(ck::is_complete(d.path + "/b"));
    // Reported by wait(): not again by save().
    s.save(d.path + "/a", views(data), o);
    EXPECT_THROW(s.wait(), ck::Error);
    EXPECT_THROW(s.wait(), ck::Error);  // wait() keeps saying it
    s.save(d.path + "/c", views(data), o);
    s.wait();
    EXPECT_TRUE(ck::is_complete(d.path + "/c"));
    // A failure nobody asked about by the end: the destructor logs it.
    s.save(d.path + "/a", views(data), o);
  }
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.back().find("failed and nobody waited for it"), std::string::npos) << log.back();
}

TEST(Checkpoint, LoadsOnlyRequestedTensors) {
  const auto data = real_tensors();
  TempDir d;
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  o.predict = false;  // every tensor stands alone (cast tensors also read their source)
  ck::save(d.path + "/c", views(data), o);
  // Damage every frame of every tensor but the two requested: loading those
  // two still works, so nothing else was read (or checked).
  {
    tz::container::Reader rd(d.path + "/c/rank-00000.tzip", 1);
    const int fd = ::open((d.path + "/c/rank-00000.tzip").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    for (const auto& t : rd.tensors()) {
      if (t.name == data[1].name || t.name == data[3].name) continue;
      for (const auto& f : t.frames) {
        const uint8_t junk[16] = {0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef,
                                  0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef};
        ASSERT_EQ(::pwrite(fd, junk, 16, (off_t)(f.offset + f.size / 2)), 16);
      }
    }
    ::close(fd);
  }
  ck::Checkpoint c(d.path + "/c");
  EXPECT_EQ(c.verify().size(), data.size() - 2);
  std::vector<uint8_t> out(data[1].bytes.size());
  std::vector<uint8_t> out2(data[3].bytes.size());
  const ck::LoadRequest req[] = {{data[1].name, out.data(), out.size()}, {data[3].name, out2.data(), out2.size()}};
  c.load(req);
  EXPECT_TRUE(out == data[1].bytes);
  EXPECT_TRUE(out2 == data[3].bytes);
  EXPECT_THROW(c.read("no.such.tensor"), ck::Error);
  std::vector<uint8_t> small(4);
  const ck::LoadRequest bad[] = {{data[1].name, small.data(), small.size()}};
  EXPECT_THROW(c.load(bad), ck::Error);
}

TEST(Checkpoint, CorruptionNamesTheTensor) {
  const auto data = real_tensors();
  TempDir d;
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  const std::string dir = d.path + "/c";
  ck::save(dir, views(data), o);
  // Find the file range of one tensor through the container reader and flip
  // a byte in the middle of its first frame.
  size_t victim = 0;
  for (size_t i = 0; i < data.size(); ++i)
    if (data[i].bytes.size() > data[victim].bytes.size()) victim = i;
  uint64_t off = 0;
  {
    tz::container::Reader rd(dir + "/rank-00000.tzip", 1);
    const auto& t = rd.tensors()[(size_t)rd.find(data[victim].name)];
    off = t.frames[0].offset + t.frames[0].size / 2;
  }
  const int fd = ::open((dir + "/rank-00000.tzip").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, (off_t)off), 1);
  b ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &b, 1, (off_t)off), 1);
  ::close(fd);

  ck::Checkpoint c(dir);
  const auto bad = c.verify();
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].rfind(data[victim].name + ":", 0), 0u) << bad[0];
  try {
    c.read(data[victim].name);
    FAIL() << "corruption not detected";
  } catch (const ck::Error& e) {
    EXPECT_EQ(e.kind(), ck::ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("'" + data[victim].name + "'"), std::string::npos) << e.what();
  }
  // Same with O_DIRECT reads (or their buffered fallback where refused).
  ck::Checkpoint cd(dir, 2, /*direct_io=*/true);
  EXPECT_EQ(cd.verify(), bad);
  for (const auto& t : data)
    if (t.name != data[victim].name) {
      EXPECT_TRUE(cd.read(t.name) == t.bytes) << t.name;
      EXPECT_TRUE(c.read(t.name) == t.bytes) << t.name;
    }
}

TEST(Checkpoint, CorruptManifestIsRejected) {
  const auto data = real_tensors();
  TempDir d;
  const std::string dir = d.path + "/c";
  ck::save(dir, views(data));
  std::string m;
  {
    std::ifstream in(dir + "/manifest.json");
    m.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto pos = m.find("\"size\":");
  ASSERT_NE(pos, std::string::npos);
  m[pos + 8] = m[pos + 8] == '1' ? '2' : '1';
  std::ofstream(dir + "/manifest.json") << m;
  EXPECT_FALSE(ck::is_complete(dir));
  try {
    ck::Checkpoint c(dir);
    FAIL();
  } catch (const ck::Error& e) {
    EXPECT_EQ(e.kind(), ck::ErrorKind::kCorrupt) << e.what();
  }
}

TEST(Checkpoint, IncompleteDirectoryIsNeverOpened) {
  const auto data = real_tensors();
  TempDir d;
  ck::save(d.path + "/step-1", views(data));
  fs::create_directories(d.path + "/step-2");
  fs::copy_file(d.path + "/step-1/rank-00000.tzip", d.path + "/step-2/rank-00000.tzip");
  try {
    ck::Checkpoint c(d.path + "/step-2");
    FAIL();
  } catch (const ck::Error& e) {
    EXPECT_EQ(e.kind(), ck::ErrorKind::kIncomplete) << e.what();
  }
  EXPECT_EQ(ck::latest(d.path), d.path + "/step-1");
  EXPECT_THROW(ck::save(d.path + "/step-1", views(data)), ck::Error);  // never overwrites a complete one
}

TEST(Checkpoint, MultiRankCommit) {
  const auto data = real_tensors();
  const auto v = views(data);
  const size_t half = v.size() / 2;
  TempDir d;
  const std::string dir = d.path + "/c";
  ck::SaveOptions o;
  o.world_size = 2;
  o.rank = 1;
  ck::save(dir, std::span<const ck::TensorView>(v).subspan(half), o);
  EXPECT_FALSE(ck::is_complete(dir));
  EXPECT_THROW(ck::commit(dir, 2), ck::Error);  // rank 0 missing
  o.rank = 0;
  ck::save(dir, std::span<const ck::TensorView>(v).first(half), o);
  ck::commit(dir, 2);
  ck::Checkpoint c(dir);
  expect_identical(c, data);
  EXPECT_EQ(c.tensors()[c.find(data.back().name)].rank, 1);
}

TEST(Checkpoint, BadInputsAreRefused) {
  TempDir d;
  std::vector<uint8_t> b(8);
  std::vector<ck::TensorView> v = {{"a", "F32", {3}, b.data(), b.size()}};
  EXPECT_THROW(ck::save(d.path + "/x", v), ck::Error);  // size mismatch
  v = {{"a", "F33", {2}, b.data(), b.size()}};
  EXPECT_THROW(ck::save(d.path + "/x", v), ck::Error);
  v = {{"a", "F32", {2}, b.data(), b.size()}, {"a", "F32", {2}, b.data(), b.size()}};
  EXPECT_THROW(ck::save(d.path + "/x", v), ck::Error);
  EXPECT_FALSE(ck::is_complete(d.path + "/x"));
  // Empty and zero-size tensors are fine.
  v = {{"e", "BF16", {0}, nullptr, 0}, {"s", "I64", {1}, b.data(), b.size()}};
  ck::save(d.path + "/y", v);
  ck::Checkpoint c(d.path + "/y");
  EXPECT_TRUE(c.read("e").empty());
  EXPECT_TRUE(c.read("s") == b);
}

// Mixed-precision checkpoint (the fixture: BF16 weights, FP32 masters + Adam
// state): every BF16 weight is the RNE cast of its master and is stored as
// the XOR residual against it. Restores are byte-identical: all tensors, a
// cast tensor alone, a cast tensor with its source, and with perturbed
// masters (inexact predictions).
TEST(Checkpoint, CastPredictionOnFixture) {
  const std::string fx = TZ_SHARED_FIXTURES_DIR;
  if (!fs::exists(fx + "/gpt-small-step400-model-bf16.safetensors")) GTEST_SKIP() << "no shared fixtures";
  auto data = load_safetensors(fx + "/gpt-small-step400-model-bf16.safetensors");
  const size_t n_model = data.size();
  for (auto& t : load_safetensors(fx + "/gpt-small-step400-optim-fp32.safetensors")) data.push_back(std::move(t));
  TempDir d;
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  o.threads = 2;
  o.chunk_bytes = 1u << 20;
  o.predict = false;
  const auto plain = ck::save(d.path + "/plain", views(data), o);
  o.predict = true;
  const auto pred = ck::save(d.path + "/pred", views(data), o);
  EXPECT_EQ(plain.predicted, 0u);
  EXPECT_EQ(pred.predicted, n_model);
  // Manifest version 2 when tensors are predicted (version-1 readers refuse it).
  auto manifest_version = [](const std::string& dir) {
    std::ifstream f(dir + "/manifest.json");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return text.find("\"version\": 2") != std::string::npos ? 2 : text.find("\"version\": 1") != std::string::npos ? 1 : 0;
  };
  EXPECT_EQ(manifest_version(d.path + "/plain"), 1);
  EXPECT_EQ(manifest_version(d.path + "/pred"), 2);
  EXPECT_LT(pred.file_bytes + plain.raw_bytes / 200, plain.file_bytes);
  {
    ck::Checkpoint c(d.path + "/pred", 2);
    expect_identical(c, data);
    EXPECT_TRUE(c.verify().empty());
    // A cast tensor alone, then with its source in the same call.
    const Owned& w = data[0];
    EXPECT_TRUE(ck::Checkpoint(d.path + "/pred").read(w.name) == w.bytes);
    const long si = c.find("master." + w.name);
    ASSERT_GE(si, 0);
    std::vector<uint8_t> a(w.bytes.size()), b(c.tensors()[(size_t)si].size);
    const ck::LoadRequest req[] = {{w.name, a.data(), a.size()}, {"master." + w.name, b.data(), b.size()}};
    c.load(req);
    EXPECT_TRUE(a == w.bytes);
    // The rank file is a valid version-2 .tzip with in-file casts.
    tz::container::Reader rd(d.path + "/pred/rank-00000.tzip", 1);
    EXPECT_EQ(rd.version_major(), tz::container::kTzipVersionMajorPredicted);
    tz::container::ReadOptions ro;
    ro.threads = 2;
    rd.verify("", ro);
    EXPECT_TRUE(rd.read_tensor(w.name) == w.bytes);
  }
  // Perturbed masters: the casts are right almost everywhere, not exactly.
  for (auto& t : data)
    if (t.name.rfind("master.", 0) == 0)
      for (size_t i = 0; i < t.bytes.size(); i += 4 * 89) t.bytes[i + 2] ^= 0x01;
  const auto pert = ck::save(d.path + "/pert", views(data), o);
  EXPECT_GT(pert.predicted, 0u);
  ck::Checkpoint c(d.path + "/pert", 2);
  expect_identical(c, data);
  for (size_t i = 0; i < n_model; i += 7) EXPECT_TRUE(ck::Checkpoint(d.path + "/pert").read(data[i].name) == data[i].bytes);
  // Damage to a master is reported when its cast tensor alone is loaded.
  {
    tz::container::Reader rd(d.path + "/pert/rank-00000.tzip", 1);
    const auto& src = rd.tensors()[(size_t)rd.find("master." + data[0].name)];
    const int fd = ::open((d.path + "/pert/rank-00000.tzip").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const uint8_t junk[4] = {0xde, 0xad, 0xbe, 0xef};
    ASSERT_EQ(::pwrite(fd, junk, 4, (off_t)(src.frames[0].offset + src.frames[0].size / 2)), 4);
    ::close(fd);
    try {
      ck::Checkpoint(d.path + "/pert").read(data[0].name);
      ADD_FAILURE() << "damage not detected";
    } catch (const ck::Error& e) {
      EXPECT_EQ(e.kind(), ck::ErrorKind::kCorrupt);
      EXPECT_NE(std::string(e.what()).find("master." + data[0].name), std::string::npos) << e.what();
    }
  }
}

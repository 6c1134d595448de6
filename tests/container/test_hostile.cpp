// Crafted .tzip files from the readers' review (issue 13) and what each must
// give: a one-line error naming the file and the problem, reached in under
// a second of CPU and 256 MiB, no hang, no output; verify failing exactly as
// decompress does. Each case runs in a child process (fork) so that its own
// peak memory and CPU time are measured (wait4), through the library and
// through the tzip CLI. With TZ_HOSTILE_OUT=DIR set, the crafted files are
// also copied there (seeds of the fuzz corpus, tests/container/corpus).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xxhash.h>
#include <zstd.h>

#include "container/file_refs.hpp"
#include "tensorzip/container.hpp"
#include "tz_test_files.hpp"       // tests/support
#include "tz_test_tzip_edit.hpp"  // tests/support

namespace tc = tz::container;
namespace fs = std::filesystem;
using namespace tz_test;
using J = nlohmann::json;

namespace {

// Bounds on what a hostile file may cost before it is refused. Memory is
// deterministic and checked tightly. CPU time is not a speed target here
// (the measured worst case, ~0.5 s for a 100 MiB header, is a benchmark's
// figure: doc/container.md section 6): the bound is a hang guard, 20x above
// that, so that a quadratic or unbounded pass fails while a loaded machine
// does not.
constexpr double kHangGuardCpuSeconds = 10.0;
constexpr long kMaxRssKiB = 256 * 1024;

// ---- building files -----------------------------------------------------------
void write_st(const std::string& p, const std::string& header, const Bytes& data) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) b[i] = (uint8_t)((uint64_t)header.size() >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  write_all(p, b);
}

// FP32 tensors "w0".."w{n-1}" of `elems` elements; `step` perturbs a few
// elements per tensor (so a delta against step 0 pays).
void write_weights(const std::string& p, int n, size_t elems, int step) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::string h = "{";
  Bytes data;
  for (int t = 0; t < n; ++t) {
    std::vector<float> v(elems);
    for (auto& x : v) x = nd(rng);
    for (int s = 0; s < step; ++s) v[(s * 7919) % elems] += 1e-3f;
    const size_t b = data.size();
    data.resize(b + elems * 4);
    std::memcpy(data.data() + b, v.data(), elems * 4);
    h += std::string(t ? "," : "") + "\"w" + std::to_string(t) + "\":{\"dtype\":\"F32\",\"shape\":[" +
         std::to_string(elems) + "],\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(data.size()) + "]}";
  }
  h += "}";
  write_st(p, h, data);
}

// A whole .tzip file from a header JSON (no frames: the header at 64).
Bytes tzip_from_json(const std::string& json, uint16_t major, bool compress) {
  Bytes f(64, 0);
  std::memcpy(f.data(), "TZIP", 4);
  f[4] = (uint8_t)major;
  f[8] = compress ? 1 : 0;
  std::string stored = json;
  if (compress) {
    std::string z(ZSTD_compressBound(json.size()), '\0');
    z.resize(ZSTD_compress(z.data(), z.size(), json.data(), json.size(), 1));
    stored = z;
  }
  f.insert(f.end(), stored.begin(), stored.end());
  Bytes t(48, 0);
  put64(t.data(), 64);
  put64(t.data() + 8, stored.size());
  put64(t.data() + 16, XXH64(stored.data(), stored.size(), 0));
  t[24] = (uint8_t)major;
  std::memcpy(t.data() + 44, "PIZT", 4);
  f.insert(f.end(), t.begin(), t.end());
  put64(f.data() + f.size() - 16, XXH64(f.data(), f.size() - 16, 0));
  return f;
}

uint64_t trailer_file_sum(const Bytes& f) { return le64(f.data() + f.size() - 16); }

std::string hex16(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}

// ---- running a case in a child ---------------------------------------------------
struct Outcome {
  int code = -1;          // exit code (128 + signal when killed)
  std::string message;    // the error's what() (library) or stderr (CLI)
  double cpu_s = 0;       // user + system CPU of the child
  long max_rss_kib = 0;   // its peak resident set
};

// The parent's side of a case: what the child wrote to the pipe, its exit
// code, CPU time and peak memory.
Outcome collect_child(pid_t pid, int pfd[2]) {
  close(pfd[1]);
  Outcome o;
  char buf[4096];
  for (ssize_t n; (n = read(pfd[0], buf, sizeof buf)) > 0;) o.message.append(buf, (size_t)n);
  close(pfd[0]);
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  o.cpu_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
  o.max_rss_kib = ru.ru_maxrss;
  return o;
}

Outcome in_child(const std::function<int(std::string*)>& body) {
  int pfd[2];
  EXPECT_EQ(pipe(pfd), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(pfd[0]);
    alarm(20);  // a hang (a FIFO opened for reading) ends the child
    std::string msg;
    int code = 0;
    try {
      code = body(&msg);
    } catch (const tc::Error& e) {
      msg = e.what();
      code = 10 + (int)e.kind();
    } catch (const std::exception& e) {
      msg = std::string("unexpected exception: ") + e.what();
      code = 99;
    }
    if (!msg.empty() && write(pfd[1], msg.data(), msg.size()) < 0) code = 98;
    _exit(code);
  }
  return collect_child(pid, pfd);
}

// The tzip CLI on `args`, stderr captured.
Outcome run_tzip(const std::vector<std::string>& args) {
  int pfd[2];
  EXPECT_EQ(pipe(pfd), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(pfd[0]);
    dup2(pfd[1], 2);
    const int nul = open("/dev/null", O_WRONLY);
    dup2(nul, 1);
    alarm(20);
    std::vector<char*> argv;
    std::string bin = TZ_TZIP_BIN;
    argv.push_back(bin.data());
    std::vector<std::string> a = args;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return collect_child(pid, pfd);
}

class Hostile : public DirTest {
 protected:
  std::string tag() const override { return "tz_hostile"; }

  // verify and decompress through the library (each in a child): both fail,
  // with the same message, naming the file and containing `expect`, within
  // the bounds; no output is left. Then the CLI's verify, decompress and
  // inspect the same way (inspect may succeed). Returns the message.
  std::string expect_refused(const std::string& file, const std::string& expect, const tc::ReadOptions& ro = {}) {
    seed(file);
    const std::string out = p("restored.safetensors");
    const Outcome v = in_child([&](std::string*) {
      tc::Reader r(file, 1);
      r.verify("", ro);
      return 0;
    });
    const Outcome d = in_child([&](std::string*) {
      tc::Reader r(file, 1);
      r.export_safetensors(out, ro);
      return 0;
    });
    for (const Outcome* o : {&v, &d}) {
      EXPECT_NE(o->code, 0) << file << ": accepted";
      EXPECT_LT(o->code, 99) << o->message;  // a tc::Error, not a crash or another exception
      EXPECT_NE(o->message.find(expect), std::string::npos) << o->message;
      EXPECT_NE(o->message.find(fs::path(file).filename().string()), std::string::npos) << o->message;
      EXPECT_EQ(o->message.find('\n'), std::string::npos) << o->message;
      EXPECT_LT(o->cpu_s, kHangGuardCpuSeconds) << o->message;
      EXPECT_LT(o->max_rss_kib, kMaxRssKiB) << o->message;
    }
    EXPECT_EQ(v.message, d.message) << "verify and decompress disagree";
    EXPECT_FALSE(fs::exists(out));
#ifdef TZ_TZIP_BIN
    std::vector<std::string> refs;
    for (const auto& r : ro.refs) refs.push_back("--ref"), refs.push_back(r);
    std::vector<std::string> va = {"verify", file}, da = {"decompress", file, "-o", out};
    va.insert(va.end(), refs.begin(), refs.end());
    da.insert(da.end(), refs.begin(), refs.end());
    for (const auto& args : {va, da}) {
      const Outcome c = run_tzip(args);
      EXPECT_TRUE(c.code == 2 || c.code == 3) << args[0] << ": exit " << c.code << ": " << c.message;
      EXPECT_NE(c.message.find(expect), std::string::npos) << args[0] << ": " << c.message;
      EXPECT_EQ(std::count(c.message.begin(), c.message.end(), '\n'), 1) << args[0] << ": " << c.message;
      EXPECT_LT(c.cpu_s, kHangGuardCpuSeconds) << args[0];
      EXPECT_LT(c.max_rss_kib, kMaxRssKiB) << args[0];
    }
    const Outcome i = run_tzip({"inspect", file});
    EXPECT_LT(i.code, 64) << i.message;  // shown or refused, never a crash
    EXPECT_LT(i.cpu_s, kHangGuardCpuSeconds);
    EXPECT_LT(i.max_rss_kib, kMaxRssKiB);
    EXPECT_FALSE(fs::exists(out));
#endif
    std::printf("%s: %s (verify %.3f s CPU, %ld MiB)\n", fs::path(file).filename().c_str(), v.message.c_str(), v.cpu_s,
                v.max_rss_kib / 1024);
    return v.message;
  }

  // With TZ_HOSTILE_OUT, the file is kept as a corpus seed (mode 1: a whole
  // .tzip file; two-file seeds are written by seed_pair).
  void seed(const std::string& file) {
    const char* out = std::getenv("TZ_HOSTILE_OUT");
    if (!out || fs::file_size(file) > (2u << 20)) return;
    Bytes b = read_all(file);
    b.insert(b.begin(), 0x01);
    write_all(std::string(out) + "/hostile_" + fs::path(file).stem().string(), b);
  }
  void seed_pair(const std::string& name, const Bytes& a, const Bytes& b) {
    const char* out = std::getenv("TZ_HOSTILE_OUT");
    if (!out) return;
    Bytes s = {0x80, (uint8_t)a.size(), (uint8_t)(a.size() >> 8), (uint8_t)(a.size() >> 16), (uint8_t)(a.size() >> 24)};
    s.insert(s.end(), a.begin(), a.end());
    s.insert(s.end(), b.begin(), b.end());
    write_all(std::string(out) + "/hostile_pair_" + name, s);
  }

  // base.tzip (standalone) and delta.tzip, a delta against base.tzip
  // (reference recorded as "base.tzip", with its header checksum).
  void make_pair(int tensors = 2, size_t elems = 16384) {
    write_weights(p("base.safetensors"), tensors, elems, 0);
    write_weights(p("delta.safetensors"), tensors, elems, 3);
    tc::compress_file(p("base.safetensors"), p("base.tzip"), tc::WriteOptions{});
    tc::WriteOptions o;
    o.ref = p("base.tzip");
    tc::compress_file(p("delta.safetensors"), p("delta.tzip"), o);
    tc::Reader r(p("delta.tzip"), 1);
    ASSERT_EQ(r.references().size(), 1u);
    ASSERT_EQ(r.references()[0].file, "base.tzip");
    ASSERT_TRUE(r.references()[0].has_header_xxh64);
  }
};

}  // namespace

// The valid pair the crafted cases start from: verify and restore work.
TEST_F(Hostile, ValidDeltaPairReads) {
  make_pair(1, 4096);  // small: its variants are fuzz corpus seeds
  tc::Reader r(p("delta.tzip"), 1);
  EXPECT_NO_THROW(r.verify("", tc::ReadOptions{}));
  EXPECT_NO_THROW(r.verify(p("delta.safetensors"), tc::ReadOptions{}));
  // Seeds of the fuzzer's two-file mode: a.tzip naming b.tzip (valid), and
  // naming itself, the FIFO c.tzip, the folder d.tzip, the link e.tzip (to
  // a.tzip), paths outside.
  const Bytes d = read_all(p("delta.tzip")), b = read_all(p("base.tzip"));
  for (const char* name : {"b.tzip", "a.tzip", "c.tzip", "d.tzip", "e.tzip", "/etc/passwd", "../b.tzip"}) {
    const Bytes a = with_header(d, [&](J& j) { j["references"][0]["file"] = name; });
    std::string tag = name;
    for (char& c : tag)
      if (!isalnum((unsigned char)c)) c = '_';
    seed_pair(tag, a, b);
  }
}

// A .tzip listing itself as its reference (the review: recursion until file
// descriptors ran out, tens of GB with a large header): refused at the
// first repeat, before its header is read a second time, naming the chain.
TEST_F(Hostile, SelfReferenceIsACycle) {
  make_pair();
  const Bytes d = read_all(p("delta.tzip"));
  const uint64_t sum = 0x1234567890abcdefull;
  // 8 MB of incompressible metadata: a large header, which each level of
  // recursion used to hold a copy of.
  std::mt19937_64 rng(5);
  std::string big;
  while (big.size() < (8u << 20)) big += hex16(rng());
  auto self_ref = [&](const char* name) {
    Bytes f = with_header(d, [&](J& j) {
      j["references"][0] = {{"file", name}, {"xxh64", hex16(sum)}};
      j["user_metadata"]["pad"] = big;
    });
    put64(f.data() + f.size() - 16, sum);  // the stored number says "I am what I reference"
    return f;
  };
  write_all(p("self.tzip"), self_ref("self.tzip"));
  const std::string m = expect_refused(p("self.tzip"), "reference cycle");
  EXPECT_NE(m.find("self.tzip -> "), std::string::npos) << m;
  // Through a symbolic link: the same file (device and inode).
  fs::create_symlink("self.tzip", p("alias.tzip"));
  write_all(p("self.tzip"), self_ref("alias.tzip"));
  expect_refused(p("self.tzip"), "reference cycle");
}

// References that are not regular files: never opened in a blocking way.
TEST_F(Hostile, FifoDeviceAndFolderReferencesAreRefused) {
  make_pair();
  const Bytes d = read_all(p("delta.tzip"));
  ASSERT_EQ(mkfifo(p("fifo.tzip").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", p("zero.tzip"));
  fs::create_directory(p("folder.tzip"));
  for (const char* target : {"fifo.tzip", "zero.tzip", "folder.tzip"}) {
    write_all(p("needs.tzip"), with_header(d, [&](J& j) { j["references"][0]["file"] = target; }));
    expect_refused(p("needs.tzip"), std::string(target).find("folder") == 0 ? "is a directory" : "not a regular file");
  }
}

// Absolute and escaping recorded paths: refused unless the caller allows
// them or gives the file; paths writers record (same folder, parallel tree)
// are followed.
TEST_F(Hostile, RecordedPathsOutsideTheTreeNeedTheCallersSayso) {
  make_pair();
  const Bytes d = read_all(p("delta.tzip"));
  auto pointing_to = [&](const std::string& f) {
    return with_header(d, [&](J& j) { j["references"][0]["file"] = f; });
  };
  fs::create_directory(p("sub"));
  write_all(p("abs.tzip"), pointing_to(p("base.tzip")));
  write_all(p("sub/esc.tzip"), pointing_to("../base.tzip"));
  write_all(p("etc.tzip"), pointing_to("../../../../../../etc/passwd"));
  write_all(p("mid.tzip"), pointing_to("x/../base.tzip"));
  write_all(p("same.tzip"), pointing_to("../" + fs::path(dir).filename().string() + "/base.tzip"));
  expect_refused(p("abs.tzip"), "is an absolute path");
  expect_refused(p("sub/esc.tzip"), "climbs above the folder tree");
  expect_refused(p("etc.tzip"), "climbs above the folder tree");
  expect_refused(p("mid.tzip"), "'..' after a folder name");
  // A parallel tree (here the same folder, reached from its parent): followed.
  EXPECT_NO_THROW(tc::Reader(p("same.tzip"), 1).verify(p("delta.safetensors"), tc::ReadOptions{}));
  // Allowed by the caller, or given: read.
  tc::ReadOptions any;
  any.any_reference_location = true;
  EXPECT_NO_THROW(tc::Reader(p("abs.tzip"), 1).verify(p("delta.safetensors"), any));
  EXPECT_NO_THROW(tc::Reader(p("sub/esc.tzip"), 1).verify(p("delta.safetensors"), any));
  tc::ReadOptions given;
  given.refs = {p("base.tzip")};
  EXPECT_NO_THROW(tc::Reader(p("etc.tzip"), 1).verify(p("delta.safetensors"), given));
  // The rule itself.
  namespace rf = tc::refs;
  for (const char* ok : {"a.tzip", "../prev/rank-00000.tzip", "../../prev/sub/m.tzip", "sub/x.tzip", "../../a/b/c.tzip"})
    EXPECT_EQ(rf::why_not_contained(ok), "") << ok;
  for (const char* bad : {"", "/a.tzip", "../a.tzip", "../../a/b.tzip", "a//b.tzip", "./a.tzip", "a/./b.tzip",
                          "a/../b.tzip", "a/", ".."})
    EXPECT_NE(rf::why_not_contained(bad), "") << bad;
}

// Chains longer than 64 references are refused naming the chain; 64 read.
TEST_F(Hostile, ReferenceChainDepthIsBounded) {
  write_weights(p("s.safetensors"), 1, 4096, 0);
  tc::compress_file(p("s.safetensors"), p("c0.tzip"), tc::WriteOptions{});
  for (int i = 1; i <= 65; ++i) {
    write_weights(p("s.safetensors"), 1, 4096, i);
    tc::WriteOptions o;
    o.ref = p("c" + std::to_string(i - 1) + ".tzip");
    tc::compress_file(p("s.safetensors"), p("c" + std::to_string(i) + ".tzip"), o);
    ASSERT_EQ(tc::Reader(p("c" + std::to_string(i) + ".tzip"), 1).references().size(), 1u) << i;
  }
  write_weights(p("s64.safetensors"), 1, 4096, 64);
  EXPECT_NO_THROW(tc::Reader(p("c64.tzip"), 1).verify(p("s64.safetensors"), tc::ReadOptions{}));
  const std::string m = expect_refused(p("c65.tzip"), "reference chain of more than 64 references");
  EXPECT_NE(m.find("c65.tzip -> "), std::string::npos) << m;
  EXPECT_NE(m.find("c0.tzip"), std::string::npos) << m;
}

// The 9 KB file whose header inflates to ~100 MB of JSON (the review: 2.5 GB
// and 10-16 s before "missing key"): refused before decompressing.
TEST_F(Hostile, HeaderInflatingFarBeyondItsStoredSizeIsRefusedFirst) {
  {
    const std::string json = "{\"created_by\":\"" + std::string(100000000, 'A') + "\"}";
    const Bytes f = tzip_from_json(json, 1, true);
    EXPECT_LT(f.size(), 64u << 10);
    write_all(p("bomb.tzip"), f);
  }  // freed before the child runs (its resident pages would count in the child's)
  expect_refused(p("bomb.tzip"), "more than 128 times its stored size");
}

// Within the inflation bound, a large hostile header is parsed linearly and
// within the bounds: ~24 MB of tensor entries with random names, then a
// missing key (checked once the object is read).
TEST_F(Hostile, LargeHeaderWithinTheBoundIsParsedWithinTheLimits) {
  std::mt19937 rng(3);
  std::string json = "{\"tensors\":[";
  for (int i = 0; json.size() < (24u << 20); ++i) {
    json += std::string(i ? "," : "") + "{\"name\":\"" + std::to_string(rng()) + "_" + std::to_string(i) +
            "\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" + std::to_string(4 * i) + "," +
            std::to_string(4 * i + 4) +
            "],\"codec\":{\"dtype\":\"f32\",\"level\":1,\"block_elems\":65536},\"frames\":[{\"offset\":64,\"size\":"
            "48,\"xxh64\":\"" + hex16((uint64_t)rng() << 32 | rng()) + "\"}]}";
  }
  json += "]}";
  write_all(p("big.tzip"), tzip_from_json(json, 1, true));
  std::string().swap(json);
  expect_refused(p("big.tzip"), "format is not \"tzip\"");
}

// A gap of 2^64 - 2^19 bytes with no frames (the review: verify "OK", then
// decompress refused; the frame-count arithmetic overflowed).
TEST_F(Hostile, GapLargerThanItsFramesIsRefusedByVerifyAndDecompress) {
  const uint64_t n = ~0ull - (1ull << 19) + 1;
  J j = {{"format", "tzip"}, {"version", 1}, {"created_by", "x"}, {"chunk_bytes", 1u << 20}, {"data_size", n},
         {"metadata", J::object()}, {"safetensors_header", "{}"}, {"tensors", J::array()},
         {"gaps", J::array({{{"data_offsets", {0, n}},
                             {"codec", {{"dtype", "bytes"}, {"level", 1}, {"block_elems", 262144}}},
                             {"frames", J::array()}}})}};
  write_all(p("gap.tzip"), tzip_from_json(j.dump(), 1, true));
  expect_refused(p("gap.tzip"), "expected 17592186044416 frames, found 0");
  // A frame too small for the bytes it claims, and frames not covering a tensor.
  j["data_size"] = 1u << 21;
  j["gaps"][0]["data_offsets"] = {0, 1u << 21};
  j["gaps"][0]["frames"] = J::array({{{"offset", 64}, {"size", 40}, {"xxh64", "0000000000000000"}},
                                     {{"offset", 128}, {"size", 40}, {"xxh64", "0000000000000000"}}});
  write_all(p("small.tzip"), tzip_from_json(j.dump(), 1, true));
  expect_refused(p("small.tzip"), "cannot hold 1048576 bytes");
  // A frame larger than any frame of its raw size (reading it would allocate that much).
  j["data_size"] = 1u << 20;
  j["gaps"][0]["data_offsets"] = {0, 1u << 20};
  j["gaps"][0]["frames"] = J::array({{{"offset", 64}, {"size", 1ull << 40}, {"xxh64", "0000000000000000"}}});
  write_all(p("huge.tzip"), tzip_from_json(j.dump(), 1, true));
  expect_refused(p("huge.tzip"), "is larger than any frame of 1048576 bytes");
}

// Identity rests on verified data: a reference whose trailer number is the
// recorded one but whose header (or, for references recorded by earlier
// writers, whose bytes) differ is refused; a damaged frame of a reference
// is found before its bytes are used.
TEST_F(Hostile, ReferenceIdentityIsCheckedAgainstVerifiedData) {
  make_pair();
  const Bytes base = read_all(p("base.tzip"));
  const Bytes delta = read_all(p("delta.tzip"));
  const uint64_t sum = trailer_file_sum(base);
  // Same trailer number, another header (metadata added).
  Bytes forged = with_header(base, [](J& j) { j["user_metadata"]["x"] = "y"; });
  put64(forged.data() + forged.size() - 16, sum);
  write_all(p("base.tzip"), forged);
  expect_refused(p("delta.tzip"), "header checksum");
  // Recorded without the header checksum (an earlier writer): the whole
  // file is hashed.
  write_all(p("legacy.tzip"), with_header(delta, [](J& j) { j["references"][0].erase("header_xxh64"); }));
  expect_refused(p("legacy.tzip"), "whole-file checksum mismatch");
  write_all(p("base.tzip"), base);
  EXPECT_NO_THROW(tc::Reader(p("legacy.tzip"), 1).verify(p("delta.safetensors"), tc::ReadOptions{}));
  // A byte of a frame of the reference changed, its header intact: the
  // frame's xxh64 (listed in the verified header) catches it at first use.
  Bytes damaged = base;
  damaged[64 + 200] ^= 0x10;
  write_all(p("base.tzip"), damaged);
  tc::Reader r(p("delta.tzip"), 1);
  try {
    std::vector<uint8_t> out(r.tensors()[0].raw_size());
    r.read_tensor(0, out.data(), out.size());
    ADD_FAILURE() << "damaged reference frame used";
  } catch (const tc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("base.tzip"), std::string::npos) << e.what();
    // Worded as every reader words a frame whose xxh64 differs: the block
    // the codec's checksums find damaged, else the frame.
    EXPECT_NE(std::string(e.what()).find("tensor 'w0': block 0: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(data corrupted)"), std::string::npos) << e.what();
  }
  seed_pair("damaged_ref", delta, damaged);
}

// A delta whose reference lacks the tensor: decompress fails, and so does
// verify, with the same message (verify is decompress with a null sink).
TEST_F(Hostile, VerifyFailsWhereDecompressFails) {
  make_pair();
  write_weights(p("other.safetensors"), 1, 16384, 0);  // holds w0 only
  tc::compress_file(p("other.safetensors"), p("other.tzip"), tc::WriteOptions{});
  const tc::Reader o(p("other.tzip"), 1);
  const Bytes d = read_all(p("delta.tzip"));
  write_all(p("lacking.tzip"), with_header(d, [&](J& j) {
    j["references"][0] = {{"file", "other.tzip"}, {"xxh64", hex16(o.file_checksum())},
                          {"header_xxh64", hex16(o.header_checksum())}};
  }));
  expect_refused(p("lacking.tzip"), "predictor tensor 'w1' not found");
}

// Forged files in which every checksum but one agrees: a frame whose xxh64
// in the header is wrong (its bytes intact; header and whole-file checksums
// recomputed), a non-zero padding byte between two frames and one in the
// preamble's padding (whole-file checksum recomputed). Every full read
// refuses them, decompress too (it checks a frame's xxh64 before using it,
// doc/container.md section 6), with verify's message. Corpus seeds.
TEST_F(Hostile, ForgedFrameHashAndPaddingAreRefused) {
  write_weights(p("w.safetensors"), 2, 16384, 0);
  tc::compress_file(p("w.safetensors"), p("w.tzip"), tc::WriteOptions{});
  const Bytes good = read_all(p("w.tzip"));
  const tc::Reader r(p("w.tzip"), 1);
  ASSERT_EQ(r.tensors().size(), 2u);
  const tc::FrameRef f0 = r.tensors()[0].frames[0];
  const uint64_t pad = f0.offset + f0.size;  // first padding byte after frame 0
  ASSERT_NE(pad % 64, 0u) << "frame 0 of the fixture should end inside a 64-byte line";
  ASSERT_EQ(r.tensors()[1].frames[0].offset, (pad + 63) / 64 * 64);
  auto fix_file_sum = [](Bytes& b) { put64(b.data() + b.size() - 16, XXH64(b.data(), b.size() - 16, 0)); };

  write_all(p("forged_frame_hash.tzip"), with_header(good, [&](J& j) {
              j["tensors"][0]["frames"][0]["xxh64"] = hex16(f0.xxh64 ^ 1);
            }));
  expect_refused(p("forged_frame_hash.tzip"), "tensor 'w0': frame 0 (blocks 0..): checksum mismatch");

  Bytes padded = good;
  padded[pad] = 0x01;
  fix_file_sum(padded);
  write_all(p("forged_padding.tzip"), padded);
  expect_refused(p("forged_padding.tzip"), "non-zero padding byte at offset " + std::to_string(pad));

  Bytes preamble = good;
  preamble[40] = 0x80;
  fix_file_sum(preamble);
  write_all(p("forged_preamble_padding.tzip"), preamble);
  expect_refused(p("forged_preamble_padding.tzip"), "non-zero padding byte at offset 40");
}

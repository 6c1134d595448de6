// One verdict from every reader (doc/container.md section 6): each file of
// the container fuzz corpus (tests/container/corpus, decoded as the fuzz
// target decodes its inputs) is read by Reader::verify, by
// Reader::export_safetensors, by Reader::read_all (the whole-file read of
// Python's load_file) and by reading every tensor after checking the
// references (what safe_open's get_tensor does for each name). All accept
// or all refuse; the full reads refuse with the same message. The one
// documented difference: bytes that only the whole-file checksum covers
// (its own trailer field, the frames of gaps) are not read by random access.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <xxhash.h>

#include "tensorzip/container.hpp"
#include "tz_test_files.hpp"  // tests/support

namespace tc = tz::container;
namespace fs = std::filesystem;
using namespace tz_test;

namespace {

uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void set64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}

// As fuzz_container.cpp: the trailer's header and file checksums
// recomputed, when the trailer's header location lies inside the file.
void fix_checksums(Bytes& f) {
  if (f.size() < 112) return;
  uint8_t* tr = f.data() + f.size() - 48;
  const uint64_t ho = get64(tr), hs = get64(tr + 8);
  if (ho <= f.size() && hs <= f.size() - ho) set64(tr + 16, XXH64(f.data() + ho, hs, 0));
  set64(tr + 32, XXH64(f.data(), f.size() - 16, 0));
}

// The .tzip file(s) of a corpus input, written into `dir`; the path of the
// one to read, or "" for an input of the safetensors-header mode.
std::string materialize(const Bytes& in, const std::string& dir) {
  if (in.empty()) return "";
  const uint8_t sel = in[0];
  Bytes rest(in.begin() + 1, in.end());
  if (sel & 0x80) {  // two files: u32le size of a.tzip, a.tzip, b.tzip
    if (rest.size() < 4) return "";
    const uint32_t na = (uint32_t)rest[0] | (uint32_t)rest[1] << 8 | (uint32_t)rest[2] << 16 | (uint32_t)rest[3] << 24;
    if (na > rest.size() - 4) return "";
    Bytes a(rest.begin() + 4, rest.begin() + 4 + na), b(rest.begin() + 4 + na, rest.end());
    if (sel & 1) fix_checksums(a), fix_checksums(b);
    write_all(dir + "/a.tzip", a);
    write_all(dir + "/b.tzip", b);
    return dir + "/a.tzip";
  }
  if ((sel & 3) == 0) return "";
  if ((sel & 3) >= 2) fix_checksums(rest);
  write_all(dir + "/f.tzip", rest);
  return dir + "/f.tzip";
}

// "" when `body` succeeds, else the message of its tc::Error.
std::string outcome(const std::function<void()>& body) {
  try {
    body();
    return "";
  } catch (const tc::Error& e) {
    return e.what()[0] ? e.what() : "(empty message)";
  }
}

tc::ReadOptions one_thread() {
  tc::ReadOptions o;
  o.threads = 1;
  return o;
}

// A file no full read accepts while random access does, for this reason only.
bool only_whole_file_sum(const std::string& full) {
  return full.find("whole-file checksum mismatch") != std::string::npos ||
         full.find(": gap at data offset ") != std::string::npos;
}

struct Verdicts {
  std::string verify, exported, read_all, each_tensor;
};

Verdicts read_every_way(const std::string& file, const std::string& dir) {
  Verdicts v;
  v.verify = outcome([&] { tc::Reader(file, 1).verify("", one_thread()); });
  v.exported = outcome([&] { tc::Reader(file, 1).export_safetensors(dir + "/out.safetensors", one_thread()); });
  v.read_all = outcome([&] {
    tc::Reader r(file, 1);
    std::vector<std::vector<uint8_t>> bufs(r.tensors().size());
    std::vector<tc::Reader::TensorRead> reads;
    for (size_t i = 0; i < r.tensors().size(); ++i) {
      bufs[i].resize(r.tensors()[i].raw_size());
      reads.push_back(tc::Reader::TensorRead{i, bufs[i].data(), bufs[i].size()});
    }
    r.read_all(reads, one_thread());
  });
  v.each_tensor = outcome([&] {
    tc::Reader r(file, 1);
    r.check_references();
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < r.tensors().size(); ++i) {
      buf.resize(r.tensors()[i].raw_size());
      r.read_tensor(i, buf.data(), buf.size());
    }
  });
  return v;
}

std::string corpus_dir() { return std::string(TZ_CORPUS_DIR); }

std::vector<std::string> corpus_names() {
  std::vector<std::string> names;
  DIR* d = opendir(corpus_dir().c_str());
  if (!d) return names;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

class Verdict : public DirTest {
 protected:
  std::string tag() const override { return "tz_verdict"; }
};

TEST_F(Verdict, EveryReaderGivesTheSameVerdictOnTheCorpus) {
  const std::vector<std::string> names = corpus_names();
  ASSERT_GT(names.size(), 100u) << corpus_dir();
  size_t files = 0, accepted = 0, refused = 0, sum_only = 0;
  for (const std::string& n : names) {
    const std::string sub = p(n);
    fs::create_directory(sub);
    const std::string file = materialize(read_all(corpus_dir() + "/" + n), sub);
    if (file.empty()) {
      fs::remove_all(sub);
      continue;
    }
    ++files;
    const Verdicts v = read_every_way(file, sub);
    EXPECT_EQ(v.exported, v.verify) << n << ": export and verify disagree";
    EXPECT_EQ(v.read_all, v.verify) << n << ": read_all and verify disagree";
    if (v.verify.empty()) {
      ++accepted;
      EXPECT_EQ(v.each_tensor, "") << n << ": verify accepts, reading every tensor refuses";
    } else if (v.each_tensor.empty()) {
      EXPECT_TRUE(only_whole_file_sum(v.verify)) << n << ": reading every tensor accepts, verify refuses: " << v.verify;
      std::printf("%s: refused by full reads only: %s\n", n.c_str(), v.verify.c_str());
      ++sum_only;
    } else {
      ++refused;
    }
    if (!v.exported.empty()) {
      EXPECT_FALSE(fs::exists(sub + "/out.safetensors")) << n << ": a failed export left its output";
    }
    fs::remove_all(sub);
  }
  std::printf("%zu .tzip inputs: %zu accepted by all, %zu refused by all, %zu refused by full reads only "
              "(whole-file checksum)\n",
              files, accepted, refused, sum_only);
  EXPECT_GT(files, 300u);
  EXPECT_GT(accepted, 0u);
}

// The forged seeds (Hostile.ForgedFrameHashAndPaddingAreRefused): refused by
// every reader, random access included.
TEST_F(Verdict, ForgedFrameHashAndPaddingAreRefusedByEveryReader) {
  size_t found = 0;
  for (const char* n : {"hostile_forged_frame_hash", "hostile_forged_padding", "hostile_forged_preamble_padding"}) {
    if (!fs::exists(corpus_dir() + "/" + n)) {
      ADD_FAILURE() << n << " missing from the corpus";
      continue;
    }
    ++found;
    const std::string sub = p(n);
    fs::create_directory(sub);
    const std::string file = materialize(read_all(corpus_dir() + "/" + n), sub);
    ASSERT_FALSE(file.empty()) << n;
    const Verdicts v = read_every_way(file, sub);
    EXPECT_FALSE(fs::exists(sub + "/out.safetensors")) << n;
    for (const std::string* m : {&v.verify, &v.exported, &v.read_all, &v.each_tensor}) {
      EXPECT_NE(*m, "") << n << ": accepted";
      EXPECT_NE(m->find(file), std::string::npos) << *m;
      EXPECT_EQ(m->find('\n'), std::string::npos) << *m;
    }
    EXPECT_EQ(v.each_tensor, v.verify) << n;
  }
  EXPECT_EQ(found, 3u);
}

// Random access checks the padding on both sides of each frame it reads:
// a non-zero byte in any padding byte of a file (between frames, after the
// preamble, before the header) fails reading every tensor, however the
// tensors are read (one by one, or together with read_tensors).
TEST_F(Verdict, EveryPaddingByteIsCheckedByReadingEveryTensor) {
  write_all(p("w.safetensors"), [] {
    std::string h = "{";
    Bytes data;
    for (int t = 0; t < 3; ++t) {
      const size_t b = data.size(), n = 4096 * 4 + 40 * t;
      for (size_t i = 0; i < n; ++i) data.push_back((uint8_t)((i * 131 + t * 7) >> (i % 3)));
      h += std::string(t ? "," : "") + "\"t" + std::to_string(t) + "\":{\"dtype\":\"U8\",\"shape\":[" +
           std::to_string(n) + "],\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(data.size()) + "]}";
    }
    h += "}";
    Bytes st(8);
    for (int i = 0; i < 8; ++i) st[i] = (uint8_t)((uint64_t)h.size() >> (8 * i));
    st.insert(st.end(), h.begin(), h.end());
    st.insert(st.end(), data.begin(), data.end());
    return st;
  }());
  tc::compress_file(p("w.safetensors"), p("w.tzip"), tc::WriteOptions{});
  const Bytes good = read_all(p("w.tzip"));
  const tc::Reader r(p("w.tzip"), 1);
  std::vector<uint64_t> pads;  // every padding byte's offset
  uint64_t pos = 16;
  for (const auto& t : r.tensors())
    for (const auto& f : t.frames) {
      for (uint64_t o = pos; o < f.offset; ++o) pads.push_back(o);
      pos = f.offset + f.size;
    }
  const uint64_t header_offset = get64(good.data() + good.size() - 48);
  for (uint64_t o = pos; o < header_offset; ++o) pads.push_back(o);
  ASSERT_GT(pads.size(), 48u + 3u);
  for (const uint64_t o : pads) {
    Bytes bad = good;
    bad[o] = 0x20;
    fix_checksums(bad);
    write_all(p("bad.tzip"), bad);
    const std::string want = "non-zero padding byte at offset " + std::to_string(o);
    const std::string one = outcome([&] {
      tc::Reader rd(p("bad.tzip"), 1);
      for (size_t i = 0; i < rd.tensors().size(); ++i) rd.read_tensor(rd.tensors()[i].name);
    });
    const std::string together = outcome([&] {
      tc::Reader rd(p("bad.tzip"), 1);
      std::vector<std::vector<uint8_t>> bufs(rd.tensors().size());
      std::vector<tc::Reader::TensorRead> reads;
      for (size_t i = 0; i < rd.tensors().size(); ++i) {
        bufs[i].resize(rd.tensors()[i].raw_size());
        reads.push_back(tc::Reader::TensorRead{i, bufs[i].data(), bufs[i].size()});
      }
      rd.read_tensors(reads, 2);
    });
    const std::string full = outcome([&] { tc::Reader(p("bad.tzip"), 1).verify("", one_thread()); });
    for (const std::string* m : {&one, &together, &full})
      EXPECT_NE(m->find(want), std::string::npos) << "byte " << o << ": " << *m;
  }
}

}  // namespace

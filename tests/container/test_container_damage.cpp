// Container library tests: strict safetensors validation and detection of
// every kind of damage to a .tzip file (bits, truncation, headers, tables),
// and failures that leave nothing behind.
#include "container_fixture.hpp"

namespace {

// ---- safetensors validation ------------------------------------------------
struct BadCase {
  const char* name;
  std::string header;
  size_t data_size;
  const char* expect;
};

TEST_F(Container, RejectsBadSafetensors) {
  const std::vector<BadCase> cases = {
      {"bad_json", "{\"a\":{\"dtype\":\"F32\",", 4, "not valid JSON"},
      {"not_object", "[1,2]", 0, "not a safetensors file"},
      {"overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap"},
      {"out_of_range", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "out of range"},
      {"reversed", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8, "reversed"},
      {"shape_mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "data_offsets span"},
      {"overflow", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, "overflow"},
      {"overflow_bits", R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8, "overflow"},
      {"unknown_dtype", R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1, "unknown dtype"},
      {"negative", R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1, "negative"},
      {"duplicate", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2, "duplicate"},
      {"meta_type", R"({"__metadata__":{"x":1}})", 0, "__metadata__"},
      {"no_brace", "  {}", 0, "not a safetensors file"},
      {"not_object2", "{\"a\":[1,2]}", 0, "not an object"},
      {"deep", "{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", 0, "nests deeper"},
  };
  for (const auto& c : cases) {
    const std::string f = p(std::string(c.name) + ".safetensors");
    write_st(f, c.header, Bytes(c.data_size, 0));
    expect_error([&] { tc::compress_file(f, p("out.tzip"), tc::WriteOptions{}); }, tc::ErrorKind::kBadInput,
                 {c.expect, f}, c.name);
    EXPECT_EQ(tc::path_kind(p("out.tzip")), tc::PathKind::kMissing) << c.name;
  }
  // Header length larger than the file, and a file shorter than 8 bytes.
  Bytes b(16, 0);
  b[0] = 200;
  write_all(p("long.safetensors"), b);
  write_all(p("short.safetensors"), Bytes{1, 2});
  for (const char* n : {"long.safetensors", "short.safetensors"})
    expect_error([&] { tc::read_safetensors_info(p(n)); }, tc::ErrorKind::kBadInput, {"not a safetensors file", p(n)},
                 n);
  EXPECT_EQ(list_dir(dir).size(), cases.size() + 2);  // no output, no temporaries
}

TEST_F(Container, MissingFileAndDirectoryAreIOAndUsageErrors) {
  expect_error([&] { tc::compress_file(p("nope.safetensors"), p("x.tzip"), tc::WriteOptions{}); }, tc::ErrorKind::kIO,
               {p("nope.safetensors")}, "missing input");
  expect_error([&] { tc::Reader r(dir); }, tc::ErrorKind::kUsage, {"is a directory"}, "directory as input");
}

// ---- damage to .tzip files ---------------------------------------------------
std::string tiny_tzip(const std::string& dir) {
  // Two real tensors (several blocks each) and a gap: small enough to flip
  // every byte.
  const Bytes bf = real_bytes("fixture-slice-bf16.safetensors");
  Bytes data(bf.begin(), bf.begin() + 24576);
  data.insert(data.end(), {0xAA, 0xBB});
  data.insert(data.end(), bf.begin() + 131072, bf.begin() + 131072 + 16384);
  const std::string h =
      R"({"w":{"dtype":"BF16","shape":[12288],"data_offsets":[0,24576]},"v":{"dtype":"BF16","shape":[8192],"data_offsets":[24578,40962]}})";
  write_st(dir + "/tiny.safetensors", h, data);
  tc::WriteOptions o;
  o.block_elems = 4096;  // 3 and 2 blocks
  tc::compress_file(dir + "/tiny.safetensors", dir + "/tiny.tzip", o);
  return dir + "/tiny.tzip";
}

// Opens `file` and verifies every tensor on one thread (errors in file order).
void verify_one_thread(const std::string& file) {
  tc::Reader r(file, 1);
  tc::ReadOptions one;
  one.threads = 1;
  r.verify("", one);
}

TEST_F(Container, EveryFlippedBitIsDetected) {
  const Bytes good = read_all(tiny_tzip(dir));
  ASSERT_LT(good.size(), 200000u);
  tc::Reader ok(p("tiny.tzip"));
  // Byte ranges of the blocks, to check that flips there name the block.
  // Every byte outside block payloads (preamble, frame prefixes, padding,
  // header, trailer) and every 5th byte of the payloads.
  auto in_payload = [&](size_t i) {
    for (const auto& t : ok.tensors())
      for (const auto& f : t.frames)
        if (i >= f.offset + tz_frame_prefix_size(good.data() + f.offset, f.size) && i < f.offset + f.size) return true;
    return false;
  };
  size_t named = 0, in_blocks = 0, exported = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    if (in_payload(i) && i % 5 != 0) continue;
    Bytes bad = good;
    bad[i] ^= (uint8_t)(1u << (i % 8));
    write_all(p("bad.tzip"), bad);
    const std::string m = expect_error([&] { verify_one_thread(p("bad.tzip")); }, tc::ErrorKind::kBadInput, {},
                                       "flip at byte " + std::to_string(i));
    if (m.empty()) continue;
    // The export checks a frame's xxh64 before decoding it, as verify does
    // (doc/container.md 6, item 8): a flip inside a frame fails it with
    // verify's message, and leaves no output.
    if (in_payload(i) && i % 35 == 0) {
      ++exported;
      tc::Reader r(p("bad.tzip"), 1);
      tc::ReadOptions one;
      one.threads = 1;
      const std::string e = expect_error([&] { r.export_safetensors(p("out.safetensors"), one); },
                                         tc::ErrorKind::kBadInput, {}, "export, flip at byte " + std::to_string(i));
      EXPECT_EQ(e, m) << "flip at byte " << i;
      EXPECT_EQ(tc::path_kind(p("out.safetensors")), tc::PathKind::kMissing) << "flip at byte " << i;
    }
    for (const auto& t : ok.tensors())
      for (const auto& f : t.frames)
        if (i >= f.offset + tz_frame_prefix_size(good.data() + f.offset, f.size) && i < f.offset + f.size) {
          ++in_blocks;
          if (m.find("tensor '" + t.name + "'") != std::string::npos && m.find("block ") != std::string::npos) ++named;
        }
  }
  EXPECT_GT(in_blocks, 2000u);
  EXPECT_EQ(named, in_blocks);
  EXPECT_GT(exported, 50u);
}

TEST_F(Container, TruncationWrongMagicAndNewerVersion) {
  const Bytes good = read_all(tiny_tzip(dir));
  for (size_t n : {size_t(0), size_t(3), size_t(15), size_t(16), size_t(100), good.size() / 2, good.size() - 1}) {
    write_all(p("t.tzip"), Bytes(good.begin(), good.begin() + (long)n));
    expect_error([&] { tc::Reader(p("t.tzip")).verify("", tc::ReadOptions{}); }, tc::ErrorKind::kBadInput, {},
                 "truncated to " + std::to_string(n) + " bytes");
  }
  Bytes m = good;
  m[0] = 'X';
  write_all(p("m.tzip"), m);
  expect_error([&] { tc::Reader r(p("m.tzip")); }, tc::ErrorKind::kBadInput, {"not a .tzip file"}, "wrong magic");
  Bytes v = good;
  v[4] = tc::kTzipMaxReadMajor + 1;  // 2 is read since predicted tensors (section 12)
  write_all(p("v.tzip"), v);
  expect_error([&] { tc::Reader r(p("v.tzip")); }, tc::ErrorKind::kBadInput, {"newer"}, "newer major version");
}

// with_header (tests/support/tz_test_tzip_edit.hpp): the header validation
// itself, not the hash, must catch each edit.

// The header is stored as one zstd frame (preamble flag 1, section 3.2).
// Stored bytes that are not exactly one frame with a recorded size within
// the limit are refused with the file named, before any JSON is parsed; an
// uncompressed header (flag 0, files of earlier writers) still reads; other
// flag bits are refused.
TEST_F(Container, CompressedHeaderIsCheckedAndPlainHeadersStillRead) {
  const Bytes good = read_all(tiny_tzip(dir));
  ASSERT_EQ(good[8], 1) << "writers set flag 1 (zstd header)";
  const uint8_t* tr = good.data() + good.size() - 48;
  const uint64_t ho = le64(tr), hs = le64(tr + 8);
  const std::string stored(good.begin() + (long)ho, good.begin() + (long)(ho + hs));
  std::string json(ZSTD_getFrameContentSize(stored.data(), stored.size()), '\0');
  ASSERT_EQ(ZSTD_decompress(json.data(), json.size(), stored.data(), stored.size()), json.size());
  ASSERT_EQ(json.front(), '{');
  EXPECT_LT(hs * 2, json.size()) << "the header should pack well";
  // A file whose header bytes are `h`, flags `flags`, checksums fixed.
  auto with_stored = [&](const std::string& h, uint8_t flags) { return tz_test::with_stored_header(good, h, flags); };
  auto zstd = [](const std::string& in, bool with_size) {
    std::string z(ZSTD_compressBound(in.size()), '\0');
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, with_size ? 1 : 0);
    z.resize(ZSTD_compress2(c, z.data(), z.size(), in.data(), in.size()));
    ZSTD_freeCCtx(c);
    return z;
  };
  // The same header stored plain (flag 0): read and verified.
  write_all(p("plain.tzip"), with_stored(json, 0));
  {
    tc::Reader r(p("plain.tzip"));
    EXPECT_EQ(r.tensors().size(), tc::Reader(p("tiny.tzip")).tensors().size());
    EXPECT_NO_THROW(r.verify("", tc::ReadOptions{}));
  }
  std::string big(200u << 20, ' ');  // a 200 MiB header (over the 100 MiB limit)
  big.front() = '{';
  const std::vector<std::tuple<const char*, Bytes, const char*>> bad = {
      {"plain JSON under flag 1", with_stored(json, 1), "not a zstd frame"},
      {"no recorded size", with_stored(zstd(json, false), 1), "not a zstd frame"},
      {"trailing bytes", with_stored(stored + "xxxx", 1), "not exactly one zstd frame"},
      {"two frames", with_stored(stored + stored, 1), "not exactly one zstd frame"},
      {"truncated frame", with_stored(stored.substr(0, stored.size() - 3), 1), "header"},
      {"declared size over the limit", with_stored(zstd(big, true), 1), "over the"},
      {"zstd header under flag 0", with_stored(stored, 0), "header"},
      {"unknown flag", with_stored(stored, 3), "unknown flags"},
  };
  for (const auto& [what, file, msg] : bad) {
    write_all(p("h.tzip"), file);
    expect_error([&] { tc::Reader(p("h.tzip"), 1).verify("", tc::ReadOptions{}); }, tc::ErrorKind::kBadInput,
                 {p("h.tzip"), msg}, what);
  }
}

TEST_F(Container, HeaderValidationRejectsInconsistentTables) {
  const Bytes good = read_all(tiny_tzip(dir));
  write_all(p("same.tzip"), with_header(good, [](nlohmann::json&) {}));
  ASSERT_NO_THROW(tc::Reader(p("same.tzip")).verify("", tc::ReadOptions{}));
  using J = nlohmann::json;
  const std::vector<std::pair<const char*, std::function<void(J&)>>> edits = {
      {"frame offset past the header", [](J& j) { j["tensors"][0]["frames"][0]["offset"] = 1u << 30; }},
      {"overlapping frames", [](J& j) { j["tensors"][1]["frames"][0]["offset"] = j["tensors"][0]["frames"][0]["offset"]; }},
      {"unaligned frame", [](J& j) { j["tensors"][0]["frames"][0]["offset"] = 65; }},
      {"frame size overflow", [](J& j) { j["tensors"][0]["frames"][0]["size"] = ~0ull; }},
      {"tiny frame", [](J& j) { j["tensors"][0]["frames"][0]["size"] = 8; }},
      {"missing frame", [](J& j) { j["tensors"][0]["frames"] = J::array(); }},
      {"segments overlap", [](J& j) { j["tensors"][1]["data_offsets"][0] = 24000; }},
      {"gap removed", [](J& j) { j["gaps"] = J::array(); }},
      {"data_size", [](J& j) { j["data_size"] = 1u << 20; }},
      {"shape x dtype", [](J& j) { j["tensors"][0]["shape"] = {12289}; }},
      {"shape overflow", [](J& j) { j["tensors"][0]["shape"] = {1ull << 40, 1ull << 40}; }},
      {"dtype", [](J& j) { j["tensors"][0]["dtype"] = "F32"; }},
      {"unknown dtype", [](J& j) { j["tensors"][0]["dtype"] = "X9"; }},
      {"duplicate name", [](J& j) { j["tensors"][1]["name"] = j["tensors"][0]["name"]; }},
      {"renamed vs verbatim header", [](J& j) { j["tensors"][0]["name"] = "zz"; }},
      {"chunk_bytes", [](J& j) { j["chunk_bytes"] = 3000000; }},
      {"block_elems", [](J& j) { j["tensors"][0]["codec"]["block_elems"] = 5000; }},
      {"codec dtype", [](J& j) { j["tensors"][0]["codec"]["dtype"] = "f64"; }},
      {"xxh64", [](J& j) { j["tensors"][0]["frames"][0]["xxh64"] = "xyz"; }},
      {"format", [](J& j) { j["format"] = "zip"; }},
      {"version", [](J& j) { j["version"] = 2; }},
      {"not an object", [](J& j) { j = J::array(); }},
      {"verbatim header", [](J& j) { j["safetensors_header"] = "{}"; }},
  };
  for (const auto& [what, edit] : edits) {
    write_all(p("e.tzip"), with_header(good, edit));
    // Caught by the header checks, before any frame is decoded.
    const std::string m = expect_error([&] { verify_one_thread(p("e.tzip")); }, tc::ErrorKind::kBadInput, {"header"}, what);
    if (getenv("TZ_TEST_VERBOSE")) std::printf("%-28s %s\n", what, m.c_str());
  }
}

TEST_F(Container, ReadingOneTensorIgnoresDamageElsewhere) {
  tiny_tzip(dir);
  Bytes f = read_all(p("tiny.tzip"));
  tc::Reader ok(p("tiny.tzip"));
  const auto& w = ok.tensors()[(size_t)ok.find("w")];
  const Bytes want = ok.read_tensor("v");
  // Destroy w's frame entirely: v is still readable (only its frame is read),
  // w reports its damage, and a full verify fails.
  for (uint64_t i = w.frames[0].offset; i < w.frames[0].offset + w.frames[0].size; ++i) f[i] = 0x5A;
  write_all(p("bad.tzip"), f);
  tc::Reader r(p("bad.tzip"));
  EXPECT_EQ(r.read_tensor("v"), want);
  expect_error([&] { r.read_tensor("w"); }, tc::ErrorKind::kBadInput, {"tensor 'w'"}, "damaged tensor w");
  EXPECT_THROW(r.verify("", tc::ReadOptions{}), tc::Error);
}

TEST_F(Container, ExportFailureLeavesNothingBehind) {
  tiny_tzip(dir);
  Bytes bad = read_all(p("tiny.tzip"));
  tc::Reader ok(p("tiny.tzip"));
  bad[ok.tensors().back().frames[0].offset + 300] ^= 1;
  write_all(p("bad.tzip"), bad);
  tc::Reader r(p("bad.tzip"));
  EXPECT_THROW(r.export_safetensors(p("out.safetensors"), tc::ReadOptions{}), tc::Error);
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{"bad.tzip", "tiny.safetensors", "tiny.tzip"}));
}

TEST_F(Container, DiskFullIsAnIOErrorAndLeavesNoTemporary) {
  const std::string src = make_mixed("m.safetensors");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {1u << 20, 1u << 20};  // 1 MiB file size limit
    setrlimit(RLIMIT_FSIZE, &rl);
    int code = 10;
    try {
      tc::compress_file(src, p("m.tzip"), small_chunks());
      code = 11;
    } catch (const tc::Error& e) {
      code = e.kind() == tc::ErrorKind::kIO && std::string(e.what()).find("write failed") != std::string::npos ? 0 : 12;
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{"m.safetensors"}));
}

}  // namespace

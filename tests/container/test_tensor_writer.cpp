// TensorWriter (container.hpp): .tzip files from tensors in memory. Round
// trips through Reader, verify and safetensors export; pre-encoded frames
// and on-demand encoders; O_DIRECT with its fallback and custom sinks;
// abort/error leave nothing behind; bad arguments; a given safetensors
// header. Cast and delta prediction: test_tensor_writer_prediction.cpp.

#include "tensor_writer_fixture.hpp"

using namespace tensor_writer_test;

TEST(TensorWriter, RoundTripHostTensors) {
  const auto data = mixed_tensors();
  for (int level : {-1, 1, 2}) {
    TempDir d;
    tc::TensorWriterOptions o;
    o.level = level;
    o.threads = 2;
    o.slots = 2;  // fewer slots than chunks: buffers are reused
    o.chunk_bytes = 1u << 20;
    o.metadata = {{"step", "400"}};
    o.user_metadata = {{"who", "test"}};
    uint64_t last_progress = 0;
    o.progress = [&](uint64_t done, uint64_t) { last_progress = done; };
    const std::string file = d.path + "/a.tzip";
    tc::TensorWriter w(file, o);
    uint64_t raw = 0;
    for (const auto& t : data) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()), raw += t.bytes.size();
    EXPECT_FALSE(fs::exists(file));  // nothing at the final name before finish()
    const auto st = w.finish();
    EXPECT_EQ(st.raw_bytes, raw);
    EXPECT_EQ(last_progress, raw);
    EXPECT_EQ(st.file_bytes, fs::file_size(file));
    EXPECT_EQ(st.io, "pwrite");
    EXPECT_EQ(d.entries(), 1u);
    if (level > 0) {
      EXPECT_LT(st.file_bytes, raw);
    }
    ASSERT_EQ(w.tensors().size(), data.size());
    EXPECT_EQ(w.tensors()[data.size() - 4].frames.size(), 3u);  // big.f32: 3 chunks
    tc::Reader r(file, 1);
    EXPECT_EQ(r.file_checksum(), st.file_xxh64);
    EXPECT_EQ(r.user_metadata().at("who"), "test");
    expect_file_holds(file, data, o.metadata);
  }
}

// Any thread count (and any number of slots) writes the same bytes.
// Writes DIR/tTsS.tzip for 1/2/4/8 threads and 0/2 slots (1 MiB chunks),
// add(w) adding the tensors, and expects the same bytes every time.
template <class Add>
void expect_same_bytes_for_every_thread_count(const std::string& dir, Add&& add) {
  std::vector<uint8_t> first;
  for (unsigned t : {1u, 2u, 4u, 8u}) {
    for (unsigned slots : {0u, 2u}) {
      tc::TensorWriterOptions o;
      o.threads = t;
      o.slots = slots;
      o.chunk_bytes = 1u << 20;
      const std::string file = dir + "/t" + std::to_string(t) + "s" + std::to_string(slots) + ".tzip";
      tc::TensorWriter w(file, o);
      add(w);
      w.finish();
      const auto bytes = read_all(file);
      if (first.empty())
        first = bytes;
      else
        EXPECT_TRUE(bytes == first) << t << " threads, " << slots << " slots";
    }
  }
}

TEST(TensorWriter, SameBytesForEveryThreadCount) {
  const auto data = mixed_tensors();
  TempDir d;
  expect_same_bytes_for_every_thread_count(d.path, [&](tc::TensorWriter& w) {
    for (const auto& x : data) w.add(x.name, x.dtype, x.shape, x.bytes.data(), x.bytes.size());
  });
  expect_file_holds(d.path + "/t8s2.tzip", data);
}

// Many small tensors (grouped into one pipeline item per <= 1 MiB or 4096
// chunks, group_items) with pre-encoded frames and encoders between them
// (those travel alone), and a tensor of several chunks: any thread count and
// any number of slots writes the same bytes, and the file holds the tensors.
TEST(TensorWriter, ManySmallTensorsSameBytesForEveryThreadCount) {
  const auto real = load_safetensors(std::string(TZ_TEST_DATA_DIR) + "/fixture-slice-bf16.safetensors");
  std::vector<uint8_t> pool;
  for (const auto& t : real) pool.insert(pool.end(), t.bytes.begin(), t.bytes.end());
  std::vector<Owned> data;
  std::mt19937 rng(5);
  size_t at = 0;
  for (int i = 0; i < 9000; ++i) {
    const size_t n = 1 + rng() % 400;  // both sides of the codec's short path (140 elements)
    if (at + 2 * n > pool.size()) at = 0;
    std::vector<uint8_t> b(pool.begin() + (long)at, pool.begin() + (long)(at + 2 * n));
    at += 2 * n;
    if (i % 5 == 0) std::fill(b.begin(), b.end(), 0);  // constant: coded from 140 elements on
    data.push_back({"t" + std::to_string(i), i % 7 == 0 ? "I16" : "BF16", {n}, b});
  }
  Owned big{"big", "BF16", {3u << 19}, std::vector<uint8_t>(3u << 20)};  // 3 chunks of 1 MiB
  for (size_t i = 0; i < big.bytes.size(); ++i) big.bytes[i] = pool[i % pool.size()];
  data.insert(data.begin() + 4500, big);
  tz_params p{};
  p.dtype = TZ_DTYPE_BF16;
  std::vector<uint8_t> pre(tz_compress_bound(data[100].bytes.size()));
  pre.resize(tz_compress(pre.data(), pre.size(), data[100].bytes.data(), data[100].bytes.size(), &p));
  ASSERT_FALSE(tz_is_error(pre.size()));
  const Owned* enc_t = &data[6001];  // t6000, BF16
  TempDir d;
  expect_same_bytes_for_every_thread_count(d.path, [&](tc::TensorWriter& w) {
    for (size_t i = 0; i < data.size(); ++i) {
      const Owned& x = data[i];
      if (i == 100) {
        w.add_frames(x.name, x.dtype, x.shape, x.bytes.size(), {{pre.data(), pre.size()}}, 1);
      } else if (&x == enc_t) {
        w.add_encoder(x.name, x.dtype, x.shape, x.bytes.size(),
                      [enc_t, p](uint64_t, uint8_t* dst, size_t cap) {
                        return tz_compress(dst, cap, enc_t->bytes.data(), enc_t->bytes.size(), &p);
                      },
                      1);
      } else {
        w.add(x.name, x.dtype, x.shape, x.bytes.data(), x.bytes.size());
      }
    }
  });
  expect_file_holds(d.path + "/t8s2.tzip", data);
  // Reader::read_tensors groups the small frames the same way (more than
  // 4096 of them: several groups), on any thread count.
  tc::Reader r(d.path + "/t1s0.tzip", 1);
  ASSERT_EQ(r.tensors().size(), data.size());
  for (unsigned t : {1u, 2u, 4u, 8u}) {
    std::vector<std::vector<uint8_t>> got(data.size());
    std::vector<tc::Reader::TensorRead> reads;
    for (size_t i = 0; i < data.size(); ++i) {
      got[i].assign(data[i].bytes.size(), 0xAB);
      reads.push_back({i, got[i].data(), got[i].size()});
    }
    r.read_tensors(reads, t);
    size_t bad = 0;
    for (size_t i = 0; i < data.size(); ++i) bad += got[i] != data[i].bytes;
    EXPECT_EQ(bad, 0u) << t << " threads";
  }
}

// Frames encoded outside the writer (as the GPU codec produces them), given
// whole or produced on demand, are stored as they are.
TEST(TensorWriter, PreEncodedFramesAndEncoders) {
  const auto data = mixed_tensors();
  const uint64_t chunk = 1u << 20;
  TempDir d;
  tc::TensorWriterOptions o;
  o.chunk_bytes = chunk;
  o.threads = 2;
  const std::string file = d.path + "/f.tzip";
  tc::TensorWriter w(file, o);
  std::vector<std::vector<uint8_t>> keep;
  std::atomic<int> calls{0};
  for (const auto& t : data) {
    tz_dtype cd;
    ASSERT_TRUE(tc::codec_dtype_for(t.dtype, &cd));
    if (t.dtype == "BF16" || t.dtype == "F32") {
      // Even tensors: whole frames; odd: an encoder callback.
      tz_params p{};
      p.dtype = cd;
      p.level = 2;
      if ((&t - data.data()) % 2 == 0) {
        std::vector<tc::EncodedFrame> frames;
        for (uint64_t off = 0; off < t.bytes.size(); off += chunk) {
          const size_t n = std::min<uint64_t>(chunk, t.bytes.size() - off);
          keep.emplace_back(tz_compress_bound(n));
          const size_t r = tz_compress(keep.back().data(), keep.back().size(), t.bytes.data() + off, n, &p);
          ASSERT_FALSE(tz_is_error(r));
          frames.push_back({keep.back().data(), r});
        }
        w.add_frames(t.name, t.dtype, t.shape, t.bytes.size(), frames, 2);
      } else {
        const Owned* tp = &t;
        w.add_encoder(t.name, t.dtype, t.shape, t.bytes.size(),
                      [tp, p, chunk, &calls](uint64_t k, uint8_t* dst, size_t cap) {
                        ++calls;
                        const uint64_t off = k * chunk;
                        const size_t n = std::min<uint64_t>(chunk, tp->bytes.size() - off);
                        return tz_compress(dst, cap, tp->bytes.data() + off, n, &p);
                      },
                      2);
      }
    } else {
      w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    }
  }
  w.finish();
  EXPECT_GT(calls.load(), 0);
  expect_file_holds(file, data);
}

TEST(TensorWriter, BadFramesFailAndLeaveNothing) {
  TempDir d;
  std::vector<uint8_t> raw(1u << 20);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = (uint8_t)(i * 31);
  tz_params p{};
  p.dtype = TZ_DTYPE_BF16;
  std::vector<uint8_t> comp(tz_compress_bound(raw.size()));
  const size_t half = tz_compress(comp.data(), comp.size(), raw.data(), raw.size() / 2, &p);  // wrong raw size
  ASSERT_FALSE(tz_is_error(half));
  tc::TensorWriterOptions o;
  o.chunk_bytes = 1u << 20;
  {
    tc::TensorWriter w(d.path + "/x.tzip", o);
    w.add_frames("t", "BF16", {raw.size() / 2}, raw.size(), {{comp.data(), half}}, 1);
    try {
      w.finish();
      ADD_FAILURE() << "a frame of the wrong size was accepted";
    } catch (const tc::Error& e) {
      EXPECT_EQ(e.kind(), tc::ErrorKind::kUsage);
      EXPECT_NE(std::string(e.what()).find("'t'"), std::string::npos) << e.what();
    }
    EXPECT_EQ(d.entries(), 0u);
    EXPECT_THROW(w.finish(), tc::Error);  // once only
  }
  {
    // Garbage bytes as a frame; an encoder that reports an error.
    std::vector<uint8_t> junk(64, 0xAB);
    tc::TensorWriter w(d.path + "/y.tzip", o);
    w.add_frames("j", "BF16", {raw.size() / 2}, raw.size(), {{junk.data(), junk.size()}}, 1);
    EXPECT_THROW(w.finish(), tc::Error);
    tc::TensorWriter w2(d.path + "/z.tzip", o);
    w2.add_encoder("e", "F32", {4}, 16, [](uint64_t, uint8_t*, size_t) { return (size_t)-1; }, 1);
    EXPECT_THROW(w2.finish(), tc::Error);
  }
  EXPECT_EQ(d.entries(), 0u);
}

TEST(TensorWriter, AbortAndDestructionLeaveNothing) {
  TempDir d;
  std::vector<uint8_t> b(64, 1);
  {
    tc::TensorWriter w(d.path + "/a.tzip");
    w.add("x", "F32", {16}, b.data(), b.size());
    EXPECT_EQ(d.entries(), 1u);  // the temporary
    w.abort();
    EXPECT_EQ(d.entries(), 0u);
    w.abort();  // idempotent
    EXPECT_THROW(w.add("y", "F32", {16}, b.data(), b.size()), tc::Error);
    EXPECT_THROW(w.finish(), tc::Error);
  }
  {
    tc::TensorWriter w(d.path + "/b.tzip");
    w.add("x", "F32", {16}, b.data(), b.size());
  }  // destroyed unfinished
  EXPECT_EQ(d.entries(), 0u);
  // An existing output is kept unless force.
  {
    tc::TensorWriter w(d.path + "/c.tzip");
    w.add("x", "F32", {16}, b.data(), b.size());
    w.finish();
  }
  const auto size1 = fs::file_size(d.path + "/c.tzip");
  try {
    tc::TensorWriter w(d.path + "/c.tzip");
    ADD_FAILURE();
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kExists);
  }
  tc::TensorWriterOptions o;
  o.force = true;
  {
    tc::TensorWriter w(d.path + "/c.tzip", o);
    w.add("x", "F32", {8}, b.data(), 32);
    w.finish();
  }
  EXPECT_NE(fs::file_size(d.path + "/c.tzip"), size1);
  EXPECT_EQ(d.entries(), 1u);
  // A folder that does not exist: kIO naming the file.
  try {
    tc::TensorWriter w(d.path + "/missing/x.tzip");
    ADD_FAILURE();
  } catch (const tc::Error& e) {
    EXPECT_EQ(e.kind(), tc::ErrorKind::kIO);
    EXPECT_NE(std::string(e.what()).find("x.tzip"), std::string::npos);
  }
}

TEST(TensorWriter, BadArgumentsAreRefused) {
  TempDir d;
  std::vector<uint8_t> b(64, 1);
  auto expect_usage = [](auto&& f) {
    try {
      f();
      ADD_FAILURE() << "accepted";
    } catch (const tc::Error& e) {
      EXPECT_EQ(e.kind(), tc::ErrorKind::kUsage) << e.what();
    }
  };
  tc::TensorWriterOptions o;
  o.chunk_bytes = 3u << 20;
  expect_usage([&] { tc::TensorWriter w(d.path + "/a.tzip", o); });
  o.chunk_bytes = 1u << 20;
  o.level = 7;
  expect_usage([&] { tc::TensorWriter w(d.path + "/a.tzip", o); });
  o.level = 0;
  o.block_elems = 1000;
  expect_usage([&] { tc::TensorWriter w(d.path + "/a.tzip", o); });
  o.block_elems = 0;
  tc::TensorWriter w(d.path + "/a.tzip", o);
  expect_usage([&] { w.add("", "F32", {16}, b.data(), 64); });
  expect_usage([&] { w.add("x", "F33", {16}, b.data(), 64); });
  expect_usage([&] { w.add("x", "F32", {15}, b.data(), 64); });
  expect_usage([&] { w.add("x", "F32", {16}, nullptr, 64); });
  expect_usage([&] { w.add("__metadata__", "F32", {16}, b.data(), 64); });
  w.add("x", "F32", {16}, b.data(), 64);
  expect_usage([&] { w.add("x", "F32", {16}, b.data(), 64); });
  expect_usage([&] { w.add_frames("f", "F32", {16}, 64, {}, 1); });  // one frame expected
  expect_usage([&] { w.add_encoder("g", "F32", {16}, 64, nullptr, 1); });
  // A block larger than a chunk (F32 x 2^20 elements = 4 MiB > 1 MiB).
  expect_usage([&] { w.add_frames("h", "F32", {16}, 64, {{b.data(), 64}}, 1, 1u << 20); });
  w.finish();
  expect_file_holds(d.path + "/a.tzip", {{"x", "F32", {16}, b}});
}

// O_DIRECT through aligned staging buffers, on this file system (written
// with it, or refused and written buffered) and on the tests' tmpfs if any.
TEST(TensorWriter, DirectIoAndFallback) {
  const auto data = mixed_tensors();
  for (const char* base : {"/tmp", "/dev/shm", TZ_BINARY_DIR}) {
    if (!fs::is_directory(base)) continue;
    TempDir d(base);
    tc::TensorWriterOptions o;
    o.direct_io = true;
    o.direct_buffer_bytes = 64 * 1024;  // small: many staging buffers per file
    o.direct_buffers = 2;
    o.chunk_bytes = 1u << 20;
    o.threads = 2;
    const std::string file = d.path + "/d.tzip";
    tc::TensorWriter w(file, o);
    for (const auto& t : data) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    const auto st = w.finish();
    RecordProperty(std::string("direct_") + base, st.io);
    EXPECT_EQ(st.io, st.direct ? "pwrite+O_DIRECT" : "pwrite");
    EXPECT_EQ(fs::file_size(file), st.file_bytes);
    expect_file_holds(file, data);
  }
}

// Where the file system refuses O_DIRECT, the writer falls back to
// buffered writes and says so.
TEST(TensorWriter, DirectIoRefusedFallsBackToBuffered) {
  const auto data = mixed_tensors();
  TempDir d(TZ_BINARY_DIR);
  ::setenv("TZ_TEST_REFUSE_O_DIRECT", "1", 1);
  tc::TensorWriterOptions o;
  o.direct_io = true;
  tc::TensorWriter w(d.path + "/r.tzip", o);
  for (const auto& t : data) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  const auto st = w.finish();
  ::unsetenv("TZ_TEST_REFUSE_O_DIRECT");
  EXPECT_FALSE(st.direct);
  EXPECT_EQ(st.io, "pwrite");
  expect_file_holds(d.path + "/r.tzip", data);
}

// A sink that records what it is asked to write (the writer's contract with
// an I/O back end: file order, completion callbacks, alignment when direct).
TEST(TensorWriter, CustomSinkSeesAlignedOrderedWrites) {
  struct Rec : tc::Sink {
    int fd;
    bool direct;
    std::vector<std::pair<uint64_t, size_t>>* log;
    void write(uint64_t off, const void* p, size_t n, std::function<void()> done) override {
      log->push_back({off, n});
      if (direct) {
        EXPECT_EQ((off | n | (uint64_t)(uintptr_t)p) % 4096, 0u);
      }
      EXPECT_EQ(::pwrite(fd, p, n, (off_t)off), (ssize_t)n);
      if (done) done();
    }
    int drain() override { return 0; }
    std::string name() const override { return "rec"; }
  };
  const auto data = mixed_tensors();
  TempDir d(TZ_BINARY_DIR);
  for (bool direct : {false, true}) {
    std::vector<std::pair<uint64_t, size_t>> log;
    tc::TensorWriterOptions o;
    o.direct_io = direct;
    o.sink = [&](int fd, bool dir) {
      auto s = std::make_unique<Rec>();
      s->fd = fd, s->direct = dir, s->log = &log;
      return s;
    };
    const std::string file = d.path + (direct ? "/d.tzip" : "/b.tzip");
    tc::TensorWriter w(file, o);
    for (const auto& t : data) w.add(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    const auto st = w.finish();
    EXPECT_EQ(st.io.rfind("rec", 0), 0u);
    ASSERT_FALSE(log.empty());
    for (size_t i = 1; i < log.size(); ++i) EXPECT_LE(log[i - 1].first + log[i - 1].second, log[i].first);
    expect_file_holds(file, data);
  }
}

// TensorWriterOptions::safetensors_header: the export's header is the given
// JSON, byte for byte (here laid out as safetensors' own writer does: metadata
// first, tensors in data order, padded with spaces to 8 bytes); a header that
// does not describe the added tensors is refused before anything is written.
TEST(TensorWriter, GivenSafetensorsHeaderIsExportedVerbatim) {
  TempDir d;
  const std::vector<uint8_t> w(24, 7), ids(16, 1);
  std::string hdr =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("ids":{"dtype":"I64","shape":[2],"data_offsets":[24,40]}})";
  hdr.append((8 - hdr.size() % 8) % 8, ' ');
  tc::TensorWriterOptions o;
  o.threads = 1;
  o.metadata = {{"format", "pt"}};
  o.safetensors_header = hdr;
  const std::string file = d.path + "/h.tzip";
  {
    tc::TensorWriter tw(file, o);
    tw.add("w", "F32", {2, 3}, w.data(), w.size());
    tw.add("ids", "I64", {2}, ids.data(), ids.size());
    tw.finish();
  }
  tc::Reader r(file, 1);
  EXPECT_EQ(r.safetensors_header(), hdr);
  const std::string st = d.path + "/h.safetensors";
  r.export_safetensors(st, tc::ReadOptions{});
  std::string expect(8, '\0');
  for (int i = 0; i < 8; ++i) expect[i] = static_cast<char>((hdr.size() >> (8 * i)) & 0xff);
  expect += hdr;
  expect.append(w.begin(), w.end());
  expect.append(ids.begin(), ids.end());
  EXPECT_EQ(slurp(st), expect);

  // Wrong shape, a missing tensor, other metadata: kUsage from finish(), no file.
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> bad = {
      {R"({"w":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]},"ids":{"dtype":"I64","shape":[2],"data_offsets":[24,40]}})",
       {}},
      {R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", {}},
      {R"({"__metadata__":{"a":"b"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
       R"("ids":{"dtype":"I64","shape":[2],"data_offsets":[24,40]}})",
       {{"a", "c"}}},
  };
  for (const auto& [h, meta] : bad) {
    TempDir e;
    tc::TensorWriterOptions ob;
    ob.threads = 1;
    ob.metadata = meta;
    ob.safetensors_header = h;
    tc::TensorWriter tw(e.path + "/x.tzip", ob);
    tw.add("w", "F32", {2, 3}, w.data(), w.size());
    tw.add("ids", "I64", {2}, ids.data(), ids.size());
    try {
      tw.finish();
      ADD_FAILURE() << "accepted: " << h;
    } catch (const tc::Error& err) {
      EXPECT_EQ(err.kind(), tc::ErrorKind::kUsage) << err.what();
    }
    EXPECT_EQ(e.entries(), 0u) << h;
  }
}

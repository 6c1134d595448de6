// Checkpoint save/restore through the I/O back ends: O_DIRECT writes and
// reads, the fallback where O_DIRECT is refused, GPUDirect Storage's
// fallback where cuFile is missing.
#include "checkpoint_fixture.hpp"

using namespace checkpoint_test;

// O_DIRECT writes (aligned staging buffers) on each write back end, and
// restore through each read back end (io_uring or pread threads), with and
// without O_DIRECT reads.
TEST(Checkpoint, DirectWritesAndReadBackEnds) {
  const auto data = real_tensors();
  TempDir d;
  int k = 0;
  for (ck::Io io : {ck::Io::kPosix, ck::Io::kUring}) {
    for (bool direct : {false, true}) {
      ck::SaveOptions o;
      o.codec = ck::Codec::kFast;
      o.io = io;
      o.direct_io = direct;
      o.threads = 2;
      o.chunk_bytes = 1u << 20;
      const std::string dir = d.path + "/c" + std::to_string(k++);
      const auto st = ck::save(dir, views(data), o);
      RecordProperty("save_io_" + std::to_string(k), st.io);
      if (!direct) {
        EXPECT_EQ(st.io.find("O_DIRECT"), std::string::npos);
      }
      if (io == ck::Io::kPosix) {
        EXPECT_EQ(st.io.rfind("posix", 0), 0u) << st.io;
      }
      for (bool rdirect : {false, true}) {
        ck::Checkpoint c(dir, 2, rdirect, io);
        expect_identical(c, data);
        if (io == ck::Io::kPosix) {
          EXPECT_EQ(c.io(), "posix");
        } else {
          EXPECT_TRUE(c.io() == "io_uring" || c.io() == "posix") << c.io();
        }
        RecordProperty("read_io_" + std::to_string(k) + (rdirect ? "_direct" : ""), c.io());
      }
      tz::container::Reader rd(dir + "/rank-00000.tzip", 1);
      tz::container::ReadOptions ro;
      ro.threads = 1;
      rd.verify("", ro);
    }
  }
}

// A file system that refuses O_DIRECT (simulated): saves fall back to
// buffered writes and say so; restores fall back to buffered reads.
TEST(Checkpoint, DirectIoRefusedFallsBack) {
  const auto data = real_tensors();
  TempDir d;
  ::setenv("TZ_TEST_REFUSE_O_DIRECT", "1", 1);
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  o.direct_io = true;
  const auto st = ck::save(d.path + "/c", views(data), o);
  ck::Checkpoint c(d.path + "/c", 2, /*direct_io=*/true);
  ::unsetenv("TZ_TEST_REFUSE_O_DIRECT");
  EXPECT_EQ(st.io.find("O_DIRECT"), std::string::npos) << st.io;
  EXPECT_FALSE(c.direct_io());
  expect_identical(c, data);
}

// GPUDirect Storage (cuFile through dlopen): without the library, a GPU or
// a CUDA build, saves and restores fall back to POSIX/io_uring and say why.
TEST(Checkpoint, GdsFallsBackWhereCuFileIsMissing) {
  auto d0 = tz::io::decide_gds(true, 1, "libtz-no-such-cufile.so.0");
  EXPECT_FALSE(d0.use);
  EXPECT_NE(d0.reason.find("libtz-no-such-cufile.so.0"), std::string::npos) << d0.reason;
  auto d1 = tz::io::decide_gds(true, 0);
  EXPECT_FALSE(d1.use);
  EXPECT_EQ(d1.reason, "no CUDA device");
  EXPECT_FALSE(tz::io::decide_gds(false, 1).use);
  // A library that loads but is not cuFile.
  auto d2 = tz::io::decide_gds(true, 1, "libc.so.6");
  EXPECT_FALSE(d2.use);
  EXPECT_NE(d2.reason.find("lacks cuFile symbols"), std::string::npos) << d2.reason;

  const auto data = real_tensors();
  TempDir d;
  ::setenv("TZ_CUFILE_LIB", "libtz-no-such-cufile.so.0", 1);
  ck::SaveOptions o;
  o.codec = ck::Codec::kFast;
  o.io = ck::Io::kGds;
  std::string logged;
  o.log = [&](const std::string& s) { logged += s + "\n"; };
  const auto st = ck::save(d.path + "/c", views(data), o);
  EXPECT_NE(st.io.find("cuFile not used"), std::string::npos) << st.io;
  EXPECT_NE(logged.find("cuFile not used"), std::string::npos) << logged;
  ck::Checkpoint c(d.path + "/c", 2, false, ck::Io::kGds);
  expect_identical(c, data);
  EXPECT_NE(c.io().find("cuFile not used"), std::string::npos) << c.io();
  ::unsetenv("TZ_CUFILE_LIB");
}

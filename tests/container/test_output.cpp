// The output primitive (src/container/output.hpp): temporaries, publish,
// output targets, input/output overlap, attributes, stale temporaries; and
// the same rules through TensorWriter (which the Python package and the
// checkpoint engine use).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "container/cli_support.hpp"  // remove_temporaries
#include "container/output.hpp"
#include "tensorzip/container.hpp"

namespace tc = tz::container;
namespace td = tz::container::detail;
namespace fs = std::filesystem;

namespace {

class Output : public ::testing::Test {
 protected:
  void SetUp() override {
    char t[] = "/tmp/tz_output_XXXXXX";
    ASSERT_NE(mkdtemp(t), nullptr);
    dir = t;
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string p(const std::string& n) const { return dir + "/" + n; }
  std::vector<std::string> list() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
  static void put(const std::string& path, const std::string& s) { std::ofstream(path, std::ios::binary) << s; }
  static std::string get(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  std::string dir;
};

tc::ErrorKind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tc::Error& e) {
    return e.kind();
  }
  return (tc::ErrorKind)0;
}

TEST_F(Output, TemporaryNamesAreHiddenUnpredictableAndNeverLookLikeOutputs) {
  std::set<std::string> names;
  for (int i = 0; i < 200; ++i) {
    const std::string n = td::base_of(td::make_temp_name(p("model.tzip")));
    EXPECT_TRUE(td::is_temp_name(n)) << n;
    EXPECT_EQ(n.rfind(".model.tzip.tmp-", 0), 0u) << n;
    EXPECT_FALSE(n.size() >= 5 && n.compare(n.size() - 5, 5, ".tzip") == 0) << n;
    names.insert(n);
  }
  EXPECT_EQ(names.size(), 200u);  // 64 random bits each
  // Long names stay within NAME_MAX.
  EXPECT_LE(td::base_of(td::make_temp_name(p(std::string(250, 'x')))).size(), 255u);
}

TEST_F(Output, TemporaryFileIsExclusivePrivateAndRemovedUnlessReleased) {
  int fd = -1;
  {
    td::Temporary t = td::Temporary::create_file(p("a.tzip"), &fd);
    ASSERT_GE(fd, 0);
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // The descriptor is close-on-exec.
    EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    EXPECT_EQ(list().size(), 1u);
    close(fd);
  }
  EXPECT_TRUE(list().empty());  // destructor removed it
  {
    td::Temporary d = td::Temporary::create_dir(p("m.tzip"));
    put(d.path() + "/x", "data");
    fs::create_directories(d.path() + "/sub/deeper");
  }
  EXPECT_TRUE(list().empty());  // a whole folder
}

TEST_F(Output, TemporariesAreRefusedAfterACancel) {
  tc::request_cancel();
  int fd = -1;
  EXPECT_EQ(kind_of([&] { td::Temporary::create_file(p("a"), &fd); }), tc::ErrorKind::kInterrupted);
  tc::clear_cancel();
  EXPECT_TRUE(list().empty());
}

TEST_F(Output, PublishReplacesOnlyRegularFilesAndNeverFollowsLinks) {
  auto staged = [&](const std::string& content) {
    int fd = -1;
    td::Temporary t = td::Temporary::create_file(p("out"), &fd);
    EXPECT_EQ(write(fd, content.data(), content.size()), (ssize_t)content.size());
    close(fd);
    return t;
  };
  {
    td::Temporary t = staged("new");
    td::publish(t.path(), p("out"), false, false);
    t.release();
    EXPECT_EQ(get(p("out")), "new");
  }
  {
    td::Temporary t = staged("newer");
    EXPECT_EQ(kind_of([&] { td::publish(t.path(), p("out"), false, false); }), tc::ErrorKind::kExists);
    td::publish(t.path(), p("out"), true, false);
    t.release();
    EXPECT_EQ(get(p("out")), "newer");
  }
  // A link: neither it nor its target is replaced, even with force.
  put(p("target"), "precious");
  ASSERT_EQ(symlink(p("target").c_str(), p("link").c_str()), 0);
  {
    td::Temporary t = staged("x");
    EXPECT_EQ(kind_of([&] { td::publish(t.path(), p("link"), true, false); }), tc::ErrorKind::kUsage);
  }
  EXPECT_TRUE(fs::is_symlink(p("link")));
  EXPECT_EQ(get(p("target")), "precious");
  EXPECT_EQ(kind_of([&] { td::check_file_target(p("link"), true); }), tc::ErrorKind::kUsage);
  // A folder is not replaced by a file.
  fs::create_directory(p("folder"));
  EXPECT_EQ(kind_of([&] { td::check_file_target(p("folder"), true); }), tc::ErrorKind::kUsage);
  // /dev/null and a FIFO are written through.
  EXPECT_EQ(td::check_file_target("/dev/null", false), td::FileTarget::kStream);
  ASSERT_EQ(mkfifo(p("fifo").c_str(), 0600), 0);
  EXPECT_EQ(td::check_file_target(p("fifo"), false), td::FileTarget::kStream);
  EXPECT_EQ(td::check_file_target(p("new"), false), td::FileTarget::kNew);
  EXPECT_EQ(td::check_file_target(p("out"), true), td::FileTarget::kReplace);
}

TEST_F(Output, PublishExchangesAFolderInOneStep) {
  fs::create_directories(p("m.tzip/sub"));
  put(p("m.tzip/a"), "old");
  td::Temporary t = td::Temporary::create_dir(p("m.tzip"));
  put(t.path() + "/a", "new");
  EXPECT_EQ(kind_of([&] { td::publish(t.path(), p("m.tzip"), false, true); }), tc::ErrorKind::kExists);
  td::publish(t.path(), p("m.tzip"), true, true);
  t.release();
  EXPECT_EQ(get(p("m.tzip/a")), "new");
  EXPECT_FALSE(fs::exists(p("m.tzip/sub")));
  EXPECT_EQ(list(), std::vector<std::string>{"m.tzip"});  // the old folder is gone
}

TEST_F(Output, OutputThatIsContainsOrLiesInsideAnInputIsRefused) {
  fs::create_directories(p("model/sub"));
  put(p("model/w.safetensors"), "w");
  put(p("f.safetensors"), "f");
  ASSERT_EQ(link(p("f.safetensors").c_str(), p("hard").c_str()), 0);
  ASSERT_EQ(symlink(p("model").c_str(), p("alias").c_str()), 0);
  auto refused = [&](const std::string& in, const std::string& out) {
    return kind_of([&] { td::check_output_vs_input(in, out); }) == tc::ErrorKind::kUsage;
  };
  EXPECT_TRUE(refused(p("f.safetensors"), p("hard")));               // is (another name)
  EXPECT_TRUE(refused(p("model"), p("model/out.tzip")));             // lies inside
  EXPECT_TRUE(refused(p("model"), p("alias/sub/out.tzip")));         // ... through a link
  EXPECT_TRUE(refused(p("model"), p("model/sub/../x.tzip")));        // ... through ".."
  EXPECT_TRUE(refused(p("model/w.safetensors"), p("model")));        // contains
  EXPECT_TRUE(refused(p("model/sub"), dir));                         // contains, further up
  EXPECT_FALSE(refused(p("model"), p("model.tzip")));
  EXPECT_FALSE(refused(p("f.safetensors"), p("f.tzip")));
}

TEST_F(Output, AttributesOfTheSourceOrOfANewFile) {
  put(p("src"), "x");
  chmod(p("src").c_str(), 0640);
  struct timespec ts[2] = {{1000, 5}, {2000, 7}};
  ASSERT_EQ(utimensat(AT_FDCWD, p("src").c_str(), ts, 0), 0);
  int fd = -1;
  td::Temporary t = td::Temporary::create_file(p("dst"), &fd);
  td::apply_attrs(fd, td::attrs_of(p("src")), p("dst"));
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(st.st_mtim.tv_sec, 2000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 7);
  const mode_t um = umask(022);
  umask(um);
  td::apply_attrs(fd, td::attrs_of(""), p("dst"));
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u & ~um);
  close(fd);
}

TEST_F(Output, StaleTemporariesOfEndedProcessesAreRemovedOthersKept) {
  // A child makes a temporary beside "out" and dies without cleaning up (as kill -9 would).
  const pid_t child = fork();
  if (child == 0) {
    int fd = -1;
    td::Temporary t = td::Temporary::create_file(p("out"), &fd);
    t.release();  // forget it: left behind
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  // One of ours (alive) and a stranger's name.
  int fd = -1;
  td::Temporary mine = td::Temporary::create_file(p("out"), &fd);
  close(fd);
  put(p(".out.tmp-deadbeef-1-0123456789abcdef"), "another machine's");
  EXPECT_EQ(list().size(), 3u);
  td::remove_stale_temporaries(p("out"));
  const auto left = list();
  EXPECT_EQ(left.size(), 2u);
  EXPECT_TRUE(std::find(left.begin(), left.end(), td::base_of(mine.path())) != left.end());
  EXPECT_TRUE(std::find(left.begin(), left.end(), ".out.tmp-deadbeef-1-0123456789abcdef") != left.end());
}

TEST_F(Output, RemoveTemporariesTakesEveryOneAndRefusesNewOnes) {
  // In a child: remove_temporaries() is for a process about to end.
  const pid_t child = fork();
  if (child == 0) {
    std::vector<td::Temporary> keep;
    for (int i = 0; i < 300; ++i) {  // more than the fixed, signal-safe slots
      int fd = -1;
      std::string name = "f";
      name += std::to_string(i);
      keep.push_back(td::Temporary::create_file(p(name), &fd));
      close(fd);
    }
    keep.push_back(td::Temporary::create_dir(p("d")));
    fs::create_directories(keep.back().path() + "/a/b");
    if (list().size() != 301) _exit(2);
    tc::remove_temporaries();
    if (!list().empty()) _exit(3);
    int fd = -1;
    if (kind_of([&] { td::Temporary::create_file(p("late"), &fd); }) != tc::ErrorKind::kInterrupted) _exit(4);
    _exit(list().empty() ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(list().empty());
}

TEST_F(Output, TensorWriterFollowsTheOutputRules) {
  const std::vector<uint16_t> w(4096, 0x3f80);
  auto write_to = [&](const std::string& path, bool force) {
    tc::TensorWriterOptions o;
    o.force = force;
    o.threads = 1;
    tc::TensorWriter tw(path, o);
    tw.add("w", "BF16", {4096}, w.data(), w.size() * 2);
    tw.finish();
  };
  put(p("target"), "precious");
  ASSERT_EQ(symlink(p("target").c_str(), p("link.tzip").c_str()), 0);
  EXPECT_EQ(kind_of([&] { write_to(p("link.tzip"), true); }), tc::ErrorKind::kUsage);
  EXPECT_EQ(get(p("target")), "precious");
  EXPECT_EQ(kind_of([&] { write_to("/dev/null", true); }), tc::ErrorKind::kUsage);  // pwrite needs a file
  write_to(p("a.tzip"), false);
  EXPECT_EQ(kind_of([&] { write_to(p("a.tzip"), false); }), tc::ErrorKind::kExists);
  write_to(p("a.tzip"), true);
  const mode_t um = umask(022);
  umask(um);
  struct stat st;
  ASSERT_EQ(stat(p("a.tzip").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u & ~um);
  EXPECT_EQ(list(), (std::vector<std::string>{"a.tzip", "link.tzip", "target"}));
}

}  // namespace

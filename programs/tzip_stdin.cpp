// Standard input as a file the library can read (random access). A regular
// file is used as it is; a pipe is spooled to an unnamed temporary file, and
// checked as it arrives, so that garbage is refused at its first bytes and
// the spool never holds more than the stream's own structure declares:
//   safetensors (compress -): the 8-byte length and the header as soon as
//     they arrive; then exactly the data section the header declares
//     (a stream that ends early or goes on is refused);
//   .tzip (decompress -): the preamble and its padding, then each frame's
//     prefix (its size comes from its block index) and the zero padding after
//     it; after the frames, at most a header (<= kMaxHeaderBytes) and the
//     trailer. The library then validates the whole file as usual.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tensorzip/tensorzip.h"
#include "tzip_cli.hpp"

namespace tzip {

using tc::ErrorKind;

namespace {
std::string g_stdin_path;  // set once by stdin_path()

[[noreturn]] void bad(const std::string& why) { throw tc::Error(ErrorKind::kBadInput, "stdin: " + why); }

uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

mode_t default_file_mode() {
  const mode_t m = umask(022);
  umask(m);
  return 0666 & ~m;
}

// Reads standard input and copies what it reads to the spool file.
class Spool {
 public:
  explicit Spool(int fd, std::string dir) : fd_(fd), dir_(std::move(dir)), buf_(1 << 20) {}

  uint64_t offset() const { return off_; }

  // Exactly n bytes (n small enough to hold), or fewer at the end of the stream.
  size_t read_some(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      const size_t k = fill(dst + got, n - got);
      if (k == 0) break;
      got += k;
    }
    return got;
  }
  void read_exact(uint8_t* dst, size_t n, const char* what) {
    if (read_some(dst, n) != n) bad("ends after " + std::to_string(off_) + " bytes, inside " + what);
  }
  // Copies n bytes through without keeping them; returns how many there were.
  uint64_t pass(uint64_t n) {
    uint64_t done = 0;
    while (done < n) {
      const size_t k = fill(buf_.data(), (size_t)std::min<uint64_t>(n - done, buf_.size()));
      if (k == 0) break;
      done += k;
    }
    return done;
  }
  // Appends exactly n bytes to *v, growing it only as they arrive: a
  // declared size (checked against its limit) is never allocated up front.
  void read_append(std::vector<uint8_t>* v, uint64_t n, const char* what) {
    while (n > 0) {
      const size_t k = (size_t)std::min<uint64_t>(n, 1 << 20);
      const size_t at = v->size();
      v->resize(at + k);
      if (read_some(v->data() + at, k) != k) bad("ends after " + std::to_string(off_) + " bytes, inside " + what);
      n -= k;
    }
  }
  bool at_end() {
    uint8_t b;
    return fill(&b, 1) == 0;
  }

 private:
  // One read(2) of at most n bytes, written to the spool; 0 at the end.
  size_t fill(uint8_t* dst, size_t n) {
    for (;;) {
      const ssize_t r = read(STDIN_FILENO, dst, n);
      if (r < 0 && errno == EINTR && !pending_signal()) continue;
      if (r < 0 && errno == EINTR) throw tc::Error(ErrorKind::kInterrupted, "interrupted");
      if (r < 0) throw tc::Error(ErrorKind::kIO, "stdin: read failed: " + std::string(std::strerror(errno)));
      write_all(dst, (size_t)r);
      off_ += (uint64_t)r;
      return (size_t)r;
    }
  }
  void write_all(const uint8_t* p, size_t n) {
    for (size_t o = 0; o < n;) {
      const ssize_t w = write(fd_, p + o, n - o);
      if (w < 0 && errno == EINTR && !pending_signal()) continue;
      if (w < 0) throw tc::Error(ErrorKind::kIO, "stdin: cannot spool to " + dir_ + ": " + std::strerror(errno));
      o += (size_t)w;
    }
  }

  int fd_;
  std::string dir_;
  std::vector<uint8_t> buf_;
  uint64_t off_ = 0;
};

// A safetensors file: its header checked as soon as it has arrived, then
// exactly the data section it declares.
void spool_safetensors(Spool& s) {
  uint8_t len8[8];
  const size_t got = s.read_some(len8, 8);
  if (got >= 4 && std::memcmp(len8, "TZIP", 4) == 0) bad("not a safetensors file (it is a .tzip file already)");
  if (got < 8) bad("not a safetensors file (only " + std::to_string(got) + " bytes)");
  const uint64_t n = le64(len8);
  if (n > tc::kMaxHeaderBytes)
    bad("not a safetensors file (header length " + std::to_string(n) + " exceeds the " +
        std::to_string(tc::kMaxHeaderBytes) + "-byte limit)");
  if (n < 2) bad("not a safetensors file (header length " + std::to_string(n) + ")");
  std::vector<uint8_t> header;
  s.read_append(&header, n, "the safetensors header");
  // The data section's size is not known yet: validated against the largest
  // one, then the stream must hold exactly what the tensors span.
  const tc::SafetensorsInfo info = tc::parse_safetensors_header(header.data(), n, UINT64_MAX, "stdin");
  uint64_t data_end = 0;
  for (const auto& t : info.tensors) data_end = std::max(data_end, t.data_end);
  header = {};
  const uint64_t have = s.pass(data_end);
  if (have < data_end)
    bad("ends after " + std::to_string(s.offset()) + " bytes; its safetensors header declares " +
        std::to_string(8 + n + data_end));
  if (!s.at_end())
    bad("more data than its safetensors header declares (" + std::to_string(8 + n + data_end) +
        " bytes; bytes after the last tensor are accepted from a file, not from a stream)");
}

// Zero padding up to the next multiple of 64.
void spool_padding(Spool& s) {
  uint8_t pad[64];
  const size_t k = (size_t)((64 - s.offset() % 64) % 64);
  const uint64_t at = s.offset();
  s.read_exact(pad, k, "padding");
  for (size_t i = 0; i < k; ++i)
    if (pad[i] != 0) bad("not a valid .tzip file (non-zero padding byte at offset " + std::to_string(at + i) + ")");
}

// A .tzip file: preamble, frames (each one's size from its own prefix), then
// at most a header and the trailer.
void spool_tzip(Spool& s) {
  uint8_t pre[16];
  const size_t got = s.read_some(pre, 16);
  if (got < 4 || std::memcmp(pre, "TZIP", 4) != 0) bad("not a .tzip file (bad magic)");
  if (got < 16) bad("not a .tzip file (only " + std::to_string(got) + " bytes)");
  spool_padding(s);
  std::vector<uint8_t> prefix(32);
  size_t k = 0;
  for (;;) {
    // A frame, or the header (JSON '{' or a zstd frame) that follows the last one.
    k = s.read_some(prefix.data(), 32);
    const size_t psize = k == 32 ? tz_frame_prefix_size(prefix.data(), 32) : 0;
    if (k < 32 || tz_is_error(psize)) break;
    const uint64_t at = s.offset() - 32;
    const std::string where = "frame at offset " + std::to_string(at);
    if (psize > (64u << 20)) bad(where + ": a prefix of " + std::to_string(psize) + " bytes");
    s.read_append(&prefix, psize - 32, "a frame's prefix");
    tz_frame_info fi;
    const size_t ir = tz_frame_inspect(prefix.data(), psize, &fi);
    if (tz_is_error(ir)) bad(where + ": " + tz_get_error_name(ir));
    uint64_t boff = 0, bsize = 0, roff = 0, rsize = 0;
    if (fi.n_blocks > 0 &&
        tz_is_error(tz_frame_block_range(prefix.data(), psize, 0, fi.n_blocks, &boff, &bsize, &roff, &rsize)))
      bad(where + ": corrupt block index");
    const uint64_t rest = fi.n_blocks > 0 ? boff + bsize - psize : 0;
    if (s.pass(rest) < rest) bad("ends after " + std::to_string(s.offset()) + " bytes, inside the " + where);
    prefix.resize(32);
    spool_padding(s);
  }
  // After the frames: the header, then the 48-byte trailer; no more than
  // the header limit allows.
  const uint64_t header_at = s.offset() - k;
  if (k == 0) bad("ends after " + std::to_string(header_at) + " bytes, before its header");
  const bool json = prefix[0] == '{';
  const bool zst = k >= 4 && prefix[0] == 0x28 && prefix[1] == 0xB5 && prefix[2] == 0x2F && prefix[3] == 0xFD;
  if (!json && !zst)
    bad("not a valid .tzip file (offset " + std::to_string(header_at) + " holds neither a frame nor the header)");
  const uint64_t tail_limit = tc::kMaxHeaderBytes + 48;
  s.pass(tail_limit + 1 - k);
  if (s.offset() - header_at > tail_limit)
    bad("not a valid .tzip file (more than " + std::to_string(tail_limit) + " bytes after its last frame)");
}
}  // namespace

std::string stdin_path(StdinFormat format) {
  if (!g_stdin_path.empty()) return g_stdin_path;
  struct stat st;
  if (fstat(STDIN_FILENO, &st) != 0) throw tc::Error(ErrorKind::kIO, "stdin: cannot read: " + std::string(std::strerror(errno)));
  if (S_ISREG(st.st_mode)) return g_stdin_path = "/proc/self/fd/0";
  if (isatty(STDIN_FILENO)) throw UsageError("standard input is a terminal; give a file, or redirect the input");
  // A pipe: the formats need random access (a safetensors header first, a
  // .tzip trailer last), so the stream is spooled to an unnamed file.
  const char* t = std::getenv("TMPDIR");
  const std::string dir = t && *t ? t : "/tmp";
  int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string tmpl = dir + "/.tzip-stdin-XXXXXX";
    fd = mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) throw tc::Error(ErrorKind::kIO, "stdin: cannot create a spool file in " + dir + ": " + std::strerror(errno));
    unlink(tmpl.c_str());
  }
  fchmod(fd, default_file_mode());  // an output made from it gets the usual mode, not 0600
  Spool s(fd, dir);
  if (format == StdinFormat::kSafetensors) spool_safetensors(s);
  else spool_tzip(s);
  return g_stdin_path = "/proc/self/fd/" + std::to_string(fd);
}

std::string display_name(const std::string& path) {
  if (path == "-" || (!g_stdin_path.empty() && path == g_stdin_path)) return "stdin";
  return path;
}

std::string stdin_in_message(const std::string& msg) {
  if (g_stdin_path.empty()) return msg;
  std::string m = msg;
  for (size_t k; (k = m.find(g_stdin_path)) != std::string::npos;) m.replace(k, g_stdin_path.size(), "stdin");
  return m;
}

}  // namespace tzip

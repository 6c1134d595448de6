// libFuzzer target for the container Reader (doc/container.md, "Safe
// reading" and 12.3 "Resolving references"). The first input byte selects
// the entry point:
//   0x00-0x7F, 0 mod 4: the rest is a safetensors header (the JSON after the
//            8-byte length)
//   0x00-0x7F, 1 mod 4: the rest is a whole .tzip file, opened through a
//            memfd; every tensor of at most 1 MiB is read and the file verified
//   0x00-0x7F, 2,3 mod 4: the same, after the trailer's header and file
//            checksums are recomputed, so that mutations of the JSON header
//            reach the header validation instead of stopping at the hash.
//   0x80-0xFF: two .tzip files, u32le size of the first, then both: written
//            as a.tzip and b.tzip in a private folder that also holds c.tzip
//            (a FIFO), d.tzip (a folder) and e.tzip (a symbolic link to
//            a.tzip); a.tzip is opened, its references resolved (any of
//            those names, or a path outside), read and verified. Bit 0: the
//            checksums of both files are recomputed as above.
// Bad input must end in tz::container::Error; anything else (a crash, a
// sanitizer report, another exception, a hang on the FIFO) is a bug.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <xxhash.h>

#include "tensorzip/container.hpp"

namespace tc = tz::container;

namespace {

uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}

// The trailer's header and file checksums recomputed (when the trailer's
// header location lies inside the buffer).
void fix_checksums(std::vector<uint8_t>& f) {
  if (f.size() < 112) return;
  uint8_t* tr = f.data() + f.size() - 48;
  const uint64_t ho = le64(tr), hs = le64(tr + 8);
  if (ho <= f.size() && hs <= f.size() - ho) put64(tr + 16, XXH64(f.data() + ho, hs, 0));
  put64(tr + 32, XXH64(f.data(), f.size() - 16, 0));
}

// Reads what a user would: every small tensor, the last block of each, the
// small tensors again all together (read_tensors, on the ordered pipeline),
// then a verify (which resolves and checks every reference).
void exercise(tc::Reader& r) {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<tc::Reader::TensorRead> reads;
  uint64_t together = 0;
  for (size_t i = 0; i < r.tensors().size(); ++i) {
    const auto& t = r.tensors()[i];
    if (t.raw_size() > (1u << 20)) continue;
    std::vector<uint8_t> out(t.raw_size());
    try {
      r.read_tensor(i, out.data(), out.size());
    } catch (const tc::Error&) {
    }
    if (t.n_blocks() > 0 && t.block_bytes() <= (1u << 20)) {
      out.resize(t.block_bytes());
      try {
        r.read_blocks(i, t.n_blocks() - 1, 1, out.data(), out.size());
      } catch (const tc::Error&) {
      }
    }
    if (together + t.raw_size() <= (4u << 20)) {
      together += t.raw_size();
      bufs.emplace_back(t.raw_size());
      reads.push_back(tc::Reader::TensorRead{i, bufs.back().data(), bufs.back().size()});
    }
  }
  try {
    r.read_tensors(reads, 2);
  } catch (const tc::Error&) {
  }
  tc::ReadOptions o;
  o.threads = 1;
  r.verify("", o);
}

bool write_file(const std::string& path, const uint8_t* p, size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(p, 1, n, f) == n;
  return std::fclose(f) == 0 && ok;
}

// The private folder of the two-file mode, made once per process.
const std::string& ref_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/fuzz_container_refs_XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) std::abort();
    const std::string s = d;
    if (mkfifo((s + "/c.tzip").c_str(), 0600) != 0 || mkdir((s + "/d.tzip").c_str(), 0700) != 0 ||
        symlink("a.tzip", (s + "/e.tzip").c_str()) != 0)
      std::abort();
    return s;
  }();
  return dir;
}

void two_files(const uint8_t* data, size_t size, bool fix) {
  if (size < 4) return;
  const uint32_t na = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
  data += 4;
  size -= 4;
  if (na > size) return;
  std::vector<uint8_t> a(data, data + na), b(data + na, data + size);
  if (fix) fix_checksums(a), fix_checksums(b);
  const std::string& dir = ref_dir();
  if (!write_file(dir + "/a.tzip", a.data(), a.size()) || !write_file(dir + "/b.tzip", b.data(), b.size())) return;
  try {
    tc::Reader r(dir + "/a.tzip", 1);
    exercise(r);
  } catch (const tc::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  ++data;
  --size;
  if (sel & 0x80) {
    two_files(data, size, sel & 1);
    return 0;
  }
  const unsigned mode = sel & 3;
  std::vector<uint8_t> fixed;
  if (mode >= 2 && size >= 112) {
    fixed.assign(data, data + size);
    fix_checksums(fixed);
    data = fixed.data();
  }
  if (mode == 0) {
    try {
      tc::parse_safetensors_header(data, size, 8 + (uint64_t)size + 4096, "fuzz");  // 4 KiB data section
    } catch (const tc::Error&) {
    }
    return 0;
  }
  const int fd = memfd_create("fuzz_container", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t off = 0;
  while (off < size) {
    const ssize_t w = write(fd, data + off, size - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    tc::Reader r(path, 1);
    exercise(r);
  } catch (const tc::Error&) {
  }
  close(fd);
  return 0;
}

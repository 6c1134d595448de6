// libFuzzer target for the container parsers (doc/container.md, "Safe
// reading"). The first input byte selects the entry point:
//   0 mod 4: the rest is a safetensors header (the JSON after the 8-byte length)
//   1 mod 4: the rest is a whole .tzip file, opened through a memfd; every
//            tensor of at most 1 MiB is read and the file verified
//   2,3 mod 4: the same, after the trailer's header and file checksums are
//            recomputed, so that mutations of the JSON header reach the
//            header validation instead of stopping at the hash.
// Bad input must end in tz::container::Error; anything else (a crash, a
// sanitizer report, another exception) is a bug.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include <xxhash.h>

#include "tensorzip/container.hpp"

namespace tc = tz::container;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const unsigned mode = data[0] & 3;
  ++data;
  --size;
  std::vector<uint8_t> fixed;
  if (mode >= 2 && size >= 112) {
    fixed.assign(data, data + size);
    uint8_t* tr = fixed.data() + size - 48;
    auto le64 = [](const uint8_t* p) {
      uint64_t v = 0;
      for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
      return v;
    };
    auto put64 = [](uint8_t* p, uint64_t v) {
      for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
    };
    const uint64_t ho = le64(tr), hs = le64(tr + 8);
    if (ho <= size && hs <= size - ho) put64(tr + 16, XXH64(fixed.data() + ho, hs, 0));
    put64(tr + 32, XXH64(fixed.data(), size - 16, 0));
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
    }
    tc::ReadOptions o;
    o.threads = 1;
    r.verify("", o);
  } catch (const tc::Error&) {
  }
  close(fd);
  return 0;
}

// libFuzzer target for the container parsers (doc/container.md, "Safe
// reading"). The first input byte selects the entry point:
//   even: the rest is a safetensors header (the JSON after the 8-byte length)
//   odd:  the rest is a whole .tzip file, opened through a memfd; every
//         tensor of at most 1 MiB is read and the file verified.
// Bad input must end in tz::container::Error; anything else (a crash, a
// sanitizer report, another exception) is a bug.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tensorzip/container.hpp"

namespace tc = tz::container;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool tzip = data[0] & 1;
  ++data;
  --size;
  if (!tzip) {
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

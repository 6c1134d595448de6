// Seed corpus of the KV page decoder's fuzz target (tests/fuzz/fuzz_kv_page.cpp),
// made with the target's own codecs: valid pages of every codec (sizes around
// the 32-element groups, special values, incompressible bytes) and round-trip
// inputs. Run by hand, output committed:
//   build/tests/kv/tz_make_kv_corpus tests/fuzz/corpus/kv_page
#include <cstdio>
#include <fstream>
#include <string>

#include "../fuzz/fuzz_kv_page.cpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  int files = 0;
  auto write = [&](const std::string& name, uint8_t sel, const uint8_t* p, size_t n) {
    std::ofstream f(dir + "/" + name, std::ios::binary);
    f.put((char)sel);
    f.write((const char*)p, (std::streamsize)n);
    ++files;
  };
  for (int i = 0; i < 8; ++i) {
    const Codec& c = codec(i);
    const size_t es = tz::dtype_elem_size(c.tables().t.dtype);
    const std::vector<uint8_t> s = sample_bytes(c.tables().t.dtype);
    std::vector<std::vector<uint8_t>> contents;
    for (size_t n : {1u, 31u, 32u, 33u, 100u, 700u}) contents.emplace_back(s.begin(), s.begin() + (ptrdiff_t)(n * es));
    std::vector<uint8_t> special(64 * es);
    for (size_t j = 0; j < special.size(); ++j) special[j] = (uint8_t)(j % 2 ? 0x7F : 0x80 + j);  // inf / NaN-like
    contents.push_back(special);
    std::vector<uint8_t> noise(200 * es);
    uint64_t h = 1;
    for (auto& b : noise) b = (uint8_t)((h = h * 6364136223846793005ull + 1442695040888963407ull) >> 56);
    contents.push_back(noise);
    int k = 0;
    for (const auto& content : contents) {
      std::vector<uint8_t> page(c.page_bound(content.size()));
      const size_t r = c.encode(*tz::kv::portable_kernels(), page.data(), page.size(), content.data(), content.size());
      if (tz_is_error(r)) return 1;
      const std::string tag = "c" + std::to_string(i) + "_" + std::to_string(k++);
      write("page_" + tag, (uint8_t)i, page.data(), r);
      write("roundtrip_" + tag, (uint8_t)(0x80 | i), content.data(), content.size());
    }
  }
  std::printf("%d files in %s\n", files, dir.c_str());
  return 0;
}

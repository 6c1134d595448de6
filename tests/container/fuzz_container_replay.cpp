// Runs the container fuzz target over every file of a corpus folder, so that
// ordinary CI replays each input the fuzzer found interesting.
#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 1;
  }
  DIR* d = opendir(argv[1]);
  if (!d) {
    std::fprintf(stderr, "%s: cannot open corpus folder\n", argv[1]);
    return 1;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    std::ifstream f(std::string(argv[1]) + "/" + n, std::ios::binary);
    const std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(b.data(), b.size());
  }
  std::printf("replayed %zu inputs\n", names.size());
  return names.empty() ? 1 : 0;
}

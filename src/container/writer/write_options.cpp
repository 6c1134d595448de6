// The writer options' rules (container.hpp, check_write_options): level and
// block size are the codec's (codec/policy.h), the chunk size the
// container's (internal.hpp).
#include "codec/policy.h"
#include "tensorzip/container.hpp"
#include "internal.hpp"

namespace tz::container {

namespace {
[[noreturn]] void refuse(const std::string& what, const std::string& rule) {
  throw Error(ErrorKind::kUsage, what.empty() ? rule : what + ": " + rule);
}
}  // namespace

bool chunk_bytes_valid(uint64_t chunk_bytes) {
  return chunk_bytes >= detail::kMinChunkBytes && chunk_bytes <= detail::kMaxChunkBytes &&
         (chunk_bytes & (chunk_bytes - 1)) == 0;
}

void check_level(int level, const std::string& what) {
  if (const char* e = tz::policy_option_error(level, 0)) refuse(what, e);
}

void check_block_elems(uint64_t block_elems, const std::string& what) {
  if (const char* e = tz::policy_option_error(0, block_elems)) refuse(what, e);
}

void check_chunk_bytes(uint64_t chunk_bytes, const std::string& what) {
  if (!chunk_bytes_valid(chunk_bytes)) refuse(what, "chunk size must be a power of two between 1 MiB and 64 MiB");
}

void check_write_options(int level, uint64_t block_elems, uint64_t chunk_bytes, const std::string& what) {
  check_chunk_bytes(chunk_bytes, what);
  check_block_elems(block_elems, what);
  check_level(level, what);
}

}  // namespace tz::container

// Streaming .tzip writer: safetensors in, one frame per chunk of each tensor
// out. A reader thread preads chunk k+1 while workers code chunks k.. and the
// calling thread writes finished frames in order; memory is bounded by the
// pipeline slots (workers + 3 chunks), never by the file size.
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

#include "tzc_internal.hpp"
#include "tzc_io.hpp"
#include "tzc_pipeline.hpp"

namespace tz::container {

using namespace detail;


namespace {

struct Unit {
  TensorEntry* seg;
  uint64_t src_off;
  uint64_t raw;
};

struct Slot {
  Buf raw, comp;
  size_t comp_size = 0;
  uint64_t hash = 0;
};

std::string seg_label(const TensorEntry& t) {
  return t.is_gap ? "gap at data offset " + std::to_string(t.data_begin) : "tensor '" + t.name + "'";
}

}  // namespace

PassStats compress_file(const std::string& in, const std::string& out_path, const WriteOptions& opt) {
  if (opt.chunk_bytes < kMinChunkBytes || opt.chunk_bytes > kMaxChunkBytes ||
      (opt.chunk_bytes & (opt.chunk_bytes - 1)) != 0)
    fail(ErrorKind::kUsage, "chunk size must be a power of two between 1 MiB and 64 MiB");
  if (opt.block_elems && (opt.block_elems < 4096 || opt.block_elems > (1u << 20) ||
                          (opt.block_elems & (opt.block_elems - 1)) != 0))
    fail(ErrorKind::kUsage, "block size must be a power of two between 4096 and 1048576 elements");
  if (opt.level < -1 || opt.level > 3) fail(ErrorKind::kUsage, "level must be -1 (store), 0 (default), 1, 2 or 3");

  SafetensorsInfo st = read_safetensors_info(in);
  InFile src(in);
  if (src.size() != st.file_size) fail(ErrorKind::kIO, in + ": file changed while reading");
  check_not_same_file(in, out_path);
  src.advise_sequential();

  TzipHeader h;
  h.created_by = std::string("tensorzip ") + std::to_string(TZ_VERSION_MAJOR) + "." +
                 std::to_string(TZ_VERSION_MINOR) + "." + std::to_string(TZ_VERSION_PATCH);
  h.data_size = st.data_size;
  h.metadata = st.metadata;
  h.user_metadata = opt.user_metadata;
  h.safetensors_header = st.header_bytes;
  h.tensors = std::move(st.tensors);
  h.gaps = std::move(st.gaps);
  uint64_t chunk = opt.chunk_bytes;
  auto setup = [&](TensorEntry& t) {
    if (t.is_gap) t.codec_dtype = TZ_DTYPE_BYTES;
    t.level = opt.level;
    t.block_elems = opt.block_elems ? opt.block_elems : default_block_elems(t.codec_dtype);
    chunk = std::max<uint64_t>(chunk, t.block_bytes());
  };
  for (auto& t : h.tensors) setup(t);
  for (auto& t : h.gaps) setup(t);
  h.chunk_bytes = chunk;
  link_segments(&h);

  std::vector<Unit> units;
  for (const TensorEntry* cs : h.segments) {
    auto* s = const_cast<TensorEntry*>(cs);
    for (uint64_t off = 0; off < s->raw_size(); off += chunk)
      units.push_back(Unit{s, st.data_start + s->data_begin + off, std::min(chunk, s->raw_size() - off)});
  }

  OutFile out(out_path, opt.force);
  XXH64_state_t* fh = XXH64_createState();
  if (!fh) fail(ErrorKind::kInternal, "out of memory");
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> fh_guard(fh, &XXH64_freeState);
  XXH64_reset(fh, 0);
  auto emit = [&](const void* p, size_t n) {
    out.write(p, n);
    XXH64_update(fh, p, n);
  };
  static const uint8_t zeros[kAlign] = {};
  auto pad = [&] {
    const uint64_t n = align_up(out.offset()) - out.offset();
    if (n) emit(zeros, n);
  };

  uint8_t pre[kPreambleSize] = {};
  std::memcpy(pre, kMagic, 4);
  put_le16(pre + 4, kTzipVersionMajor);
  put_le16(pre + 6, kTzipVersionMinor);
  emit(pre, sizeof pre);

  const unsigned workers = resolve_threads(opt.threads);
  CtxSet ctx(workers);
  std::vector<Slot> slots(workers + 3);  // one being read, one being written, one spare
  uint64_t done = st.data_start;
  if (opt.progress) opt.progress(done, st.file_size);

  run_pipeline(
      units.size(), slots, workers,
      [&](size_t i, Slot& s) { src.pread_exact(units[i].src_off, s.raw.reserve(units[i].raw), units[i].raw); },
      [&](size_t i, Slot& s, unsigned w) {
        const Unit& u = units[i];
        tz_params p{};
        p.dtype = u.seg->codec_dtype;
        p.level = u.seg->level;
        p.block_elems = u.seg->block_elems;
        p.threads = 1;
        uint8_t* dst = s.comp.reserve(tz_compress_bound(u.raw));
        const size_t r = tz_ctx_compress(ctx.v[w], dst, s.comp.cap, s.raw.p.get(), u.raw, &p);
        if (tz_is_error(r))
          fail(ErrorKind::kInternal, in + ": " + seg_label(*u.seg) + ": compression failed: " +
                                         tz_get_error_name(r) + " " + tz_last_error_detail());
        s.comp_size = r;
        s.hash = XXH64(dst, r, 0);
      },
      [&](size_t i, Slot& s) {
        pad();
        FrameRef f;
        f.offset = out.offset();
        f.size = s.comp_size;
        f.raw_size = units[i].raw;
        f.xxh64 = s.hash;
        emit(s.comp.p.get(), s.comp_size);
        units[i].seg->frames.push_back(f);
        done += units[i].raw;
        if (opt.progress) opt.progress(done, st.file_size);
      });
  slots.clear();

  pad();
  const uint64_t header_offset = out.offset();
  const std::string header = encode_header(h);
  if (header.size() > kMaxHeaderBytes)
    fail(ErrorKind::kBadInput, in + ": tensor table too large for a .tzip header (" + std::to_string(header.size()) + " bytes)");
  emit(header.data(), header.size());
  uint8_t tr[kTrailerSize] = {};
  put_le64(tr + 0, header_offset);
  put_le64(tr + 8, header.size());
  put_le64(tr + 16, XXH64(header.data(), header.size(), 0));
  put_le16(tr + 24, kTzipVersionMajor);
  put_le16(tr + 26, kTzipVersionMinor);
  emit(tr, kTrailerHashedSize);
  put_le64(tr + 32, XXH64_digest(fh));
  std::memcpy(tr + 44, kEndMagic, 4);
  out.write(tr + kTrailerHashedSize, kTrailerSize - kTrailerHashedSize);
  const uint64_t file_bytes = out.offset();
  out.commit();
  return PassStats{st.file_size, file_bytes};
}

}  // namespace tz::container

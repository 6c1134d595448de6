// Reader: reading one frame with every check of doc/container.md section 6
// (items 8 and 9): the zero padding around it, its xxh64, its header against
// the table, the codec's block checksums. Every reader goes through here:
// the whole-file pass (export, verify, read_all), whole-tensor reads
// (read_tensor, read_tensors) and partial reads (their frame prefix), so
// that they refuse a file with the same message.
#include "reader/reader_impl.hpp"

namespace tz::container {

void Reader::Impl::index_frames_and_check_padding() {
  size_t n = 0;
  frame_base.resize(h.tensors.size());
  for (size_t i = 0; i < h.tensors.size(); ++i) frame_base[i] = n, n += h.tensors[i].frames.size();
  pad_from.assign(n, 0);
  uint64_t pos = kPreambleSize;  // the previous frame's end (tiling: each frame at align_up of it)
  for (const TensorEntry* s : h.segments) {
    const size_t base = s->is_gap ? 0 : frame_base[(size_t)(s - h.tensors.data())];
    for (size_t c = 0; c < s->frames.size(); ++c) {
      if (!s->is_gap) pad_from[base + c] = pos;
      pos = s->frames[c].offset + s->frames[c].size;
    }
  }
  // The padding after the preamble and before the header (the validated
  // tiling puts the header at align_up(pos)): 48 and at most 63 bytes.
  uint8_t pad[kAlign];
  f->pread_exact(kPreambleSize, pad, kAlign - kPreambleSize);
  check_zero(pad, kAlign - kPreambleSize, kPreambleSize);
  if (pos > kPreambleSize) {
    f->pread_exact(pos, pad, header_offset - pos);
    check_zero(pad, header_offset - pos, pos);
  }
}

void Reader::Impl::check_zero(const uint8_t* p, uint64_t n, uint64_t at) const {
  for (uint64_t i = 0; i < n; ++i)
    if (p[i] != 0) padding_error(at + i);
}

// Names the frame the padding byte follows (frames are in file order).
void Reader::Impl::padding_error(uint64_t at) const {
  std::string after = "after the preamble";
  for (const TensorEntry* s : h.segments)
    for (size_t c = 0; c < s->frames.size(); ++c)
      if (s->frames[c].offset + s->frames[c].size <= at) after = "after frame " + std::to_string(c) + " of " + label(*s);
  fail(ErrorKind::kBadInput,
       path + ": non-zero padding byte at offset " + std::to_string(at) + " (" + after + ") (data corrupted)");
}

void Reader::Impl::check_frame_hash(tz_ctx* cx, const TensorEntry& t, size_t c, const uint8_t* src) const {
  const FrameRef& fr = t.frames[c];
  if (XXH64(src, fr.size, 0) == fr.xxh64) return;
  // Locate the damage: the codec's per-block checksums name the block.
  const uint64_t bpc = blocks_per_chunk(t);
  unsigned bad = 0;
  const size_t v = tz_ctx_verify(cx, src, fr.size, &bad);
  if (tz_is_error(v) && tz_get_error_code(v) != TZ_ERROR_CORRUPT_HEADER && tz_get_error_code(v) != TZ_ERROR_BAD_MAGIC &&
      tz_get_error_code(v) != TZ_ERROR_BAD_VERSION && tz_get_error_code(v) != TZ_ERROR_SRC_TRUNCATED)
    corrupt(t, "block " + std::to_string(c * bpc + bad) + ": " + tz_get_error_name(v) + " (data corrupted)");
  corrupt(t, "frame " + std::to_string(c) + " (blocks " + std::to_string(c * bpc) + "..): checksum mismatch" +
                 (tz_is_error(v) ? std::string(" in frame header: ") + tz_get_error_name(v) : std::string()) +
                 " (data corrupted)");
}

void Reader::Impl::decode_frame(tz_ctx* cx, const TensorEntry& t, size_t c, const uint8_t* src, uint8_t* dst) const {
  const FrameRef& fr = t.frames[c];
  check_frame_hash(cx, t, c, src);
  tz_frame_info info;
  const size_t ri = tz_frame_inspect(src, fr.size, &info);
  if (tz_is_error(ri)) corrupt(t, std::string("frame header: ") + tz_get_error_name(ri) + " (data corrupted)");
  check_frame_info(t, c, info);
  const size_t r = tz_ctx_decompress(cx, dst, fr.raw_size, src, fr.size);
  if (tz_is_error(r)) {
    unsigned bad = 0;
    tz_ctx_verify(cx, src, fr.size, &bad);
    corrupt(t, "block " + std::to_string(c * blocks_per_chunk(t) + bad) + ": " + tz_get_error_name(r) + " (" +
                   tz_last_error_detail() + ")");
  }
  if (r != fr.raw_size) corrupt(t, "frame " + std::to_string(c) + " decodes to the wrong size (data corrupted)");
}

void Reader::Impl::read_frame(CtxLease& cx, const TensorEntry& t, size_t index, size_t c, uint8_t* dst) {
  const FrameRef& fr = t.frames[c];
  const uint64_t lo = padding_before(index, c), end = fr.offset + fr.size, hi = padding_end(fr);
  // One read: the padding before, the frame, the padding after.
  uint8_t* const p = cx.comp().reserve(hi - lo, max_frame_size + 2 * kAlign);
  f->pread_exact(lo, p, hi - lo);
  check_zero(p, fr.offset - lo, lo);
  check_zero(p + (end - lo), hi - end, end);
  decode_frame(cx.c, t, c, p + (fr.offset - lo), dst);
  if (verify_frames) frame_ok[frame_base[index] + c].store(1, std::memory_order_release);
}

void Reader::Impl::check_frame_on_use(const TensorEntry& t, size_t index, size_t c) {
  if (!verify_frames || t.frames[c].size == 0) return;
  std::atomic<uint8_t>& ok = frame_ok[frame_base[index] + c];
  if (ok.load(std::memory_order_acquire)) return;
  const FrameRef& fr = t.frames[c];
  Buf b;
  uint8_t* p = b.reserve(fr.size);
  f->pread_exact(fr.offset, p, fr.size);
  check_frame_hash(lease().c, t, c, p);
  ok.store(1, std::memory_order_release);
}

void Reader::Impl::read_prefix(const TensorEntry& t, size_t index, size_t c, std::vector<uint8_t>* prefix) {
  const FrameRef& fr = t.frames[c];
  const uint64_t lo = padding_before(index, c), lead = fr.offset - lo;
  const size_t first = (size_t)std::min<uint64_t>(fr.size, 64 * 1024);
  prefix->resize(lead + first);
  f->pread_exact(lo, prefix->data(), lead + first);
  check_zero(prefix->data(), lead, lo);
  prefix->erase(prefix->begin(), prefix->begin() + (long)lead);
  const size_t ps = tz_frame_prefix_size(prefix->data(), prefix->size());
  if (tz_is_error(ps) || ps > fr.size)
    corrupt(t, "frame " + std::to_string(c) + " header: " + (tz_is_error(ps) ? tz_get_error_name(ps) : "too large") +
                   " (data corrupted)");
  if (ps > prefix->size()) {
    prefix->resize(ps);
    f->pread_exact(fr.offset + first, prefix->data() + first, ps - first);
  } else {
    prefix->resize(ps);
  }
  tz_frame_info info;
  const size_t r = tz_frame_inspect(prefix->data(), prefix->size(), &info);
  if (tz_is_error(r))
    corrupt(t, "frame " + std::to_string(c) + " header: " + tz_get_error_name(r) + " " + tz_last_error_detail() +
                   " (data corrupted)");
  check_frame_info(t, c, info);
}

}  // namespace tz::container

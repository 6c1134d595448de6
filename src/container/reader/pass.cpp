// Reader: the whole-file pass (doc/container.md section 6, items 8-9): export
// writes what it decodes, verify is the same pass with a null sink.
#include "codec/predict.h"
#include "pipeline.hpp"
#include "reader/reader_impl.hpp"

namespace tz::container {


// Decodes the group's frames (read into s.comp from the first one's
// read_from) into s.raw, or a requested tensor's frames straight into the
// caller's memory (read_all), predictions applied: what export writes,
// verify discards and read_all keeps.
void Reader::Impl::decode_group(const PassUnit* units, size_t count, PassSlot& s, tz_ctx* cx, uint64_t max_raw_hint,
                                const std::vector<uint8_t*>* dests) {
  const uint64_t base = units[0].read_from;
  auto dest_of = [&](const PassUnit& u) -> uint8_t* {
    if (!dests || u.seg->is_gap) return nullptr;
    uint8_t* d = (*dests)[(size_t)(u.seg - h.tensors.data())];
    return d ? d + u.c * h.chunk_bytes : nullptr;
  };
  s.raw_off.resize(count);
  uint64_t raw_n = 0;
  s.produced = 0;
  for (size_t k = 0; k < count; ++k) {
    const uint64_t n = units[k].seg->frames[units[k].c].raw_size;
    s.produced += n;
    if (dest_of(units[k])) {
      s.raw_off[k] = ~UINT64_C(0);
    } else {
      s.raw_off[k] = raw_n;
      raw_n += n;
    }
  }
  uint8_t* raw = s.raw.reserve(raw_n, max_raw_hint);
  for (size_t k = 0; k < count; ++k) {
    const PassUnit& u = units[k];
    const FrameRef& fr = u.seg->frames[u.c];
    uint8_t* dst = s.raw_off[k] == ~UINT64_C(0) ? dest_of(u) : raw + s.raw_off[k];
    if (fr.size == 0)  // all-zero residual chunk (section 12.2)
      std::memset(dst, 0, fr.raw_size);
    else
      decode_frame(cx, *u.seg, u.c, s.comp.p.get() + (fr.offset - base), dst);
    apply_prediction(*u.seg, u.c * h.chunk_bytes, dst, fr.raw_size);
  }
}

PassStats Reader::Impl::pass(const std::function<void(const uint8_t*, size_t, uint64_t)>& sink,
                             const ReadOptions& opt, bool sink_any_order, const std::vector<uint8_t*>* dests) {
  std::vector<PassUnit> units;
  uint64_t pos = kPreambleSize;
  for (const TensorEntry* s : h.segments)
    for (size_t c = 0; c < s->frames.size(); ++c) {
      units.push_back(PassUnit{s, c, pos});
      pos = s->frames[c].offset + s->frames[c].size;
    }
  XXH64_state_t* fh = XXH64_createState();
  if (!fh) fail(ErrorKind::kInternal, "out of memory");
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> guard(fh, &XXH64_freeState);
  XXH64_reset(fh, 0);
  uint8_t pre[kPreambleSize];
  f->pread_exact(0, pre, kPreambleSize);
  XXH64_update(fh, pre, kPreambleSize);
  f->advise_sequential();

  const unsigned workers = resolve_threads(opt.threads);
  CtxSet ctxs(workers);
  // One group per thread plus one more: the write of group k (the
  // slowest, in-order stage of an export) overlaps the decode of k+1 and
  // the read of k+2. More would only let the readers run ahead of the
  // writer, each extra slot another set of buffers first touched.
  const size_t window = workers + 1;
  ReusePool<PassSlot> slots(window);
  // verify is this pass with a null sink: every frame is decoded and every
  // prediction applied (references read, predictors checked) exactly as for
  // an export, so both fail on the same input with the same message.
  uint64_t done = 8 + h.safetensors_header.size();
  const uint64_t total = done + h.data_size;
  if (opt.progress) opt.progress(done, total);
  // Consecutive frames are contiguous in the file: read, decoded and passed
  // on as groups (one hand-off between threads per group).
  const std::vector<ItemGroup> groups =
      group_items(units.size(), [&](size_t i) { return units[i].seg->frames[units[i].c].raw_size; });
  auto frame_of = [&](const PassUnit& u) -> const FrameRef& { return u.seg->frames[u.c]; };
  auto comp_span = [&](const ItemGroup& g) {
    const FrameRef& last = frame_of(units[g.first + g.count - 1]);
    return last.offset + last.size - units[g.first].read_from;
  };
  // Every slot's buffers are allocated once, at the largest group's size
  // (read and decoded bytes): reused slots never grow page by page.
  uint64_t max_comp = 0, max_raw = 0;
  for (const ItemGroup& g : groups) {
    uint64_t raw = 0;
    for (size_t k = 0; k < g.count; ++k) raw += frame_of(units[g.first + k]).raw_size;
    max_comp = std::max(max_comp, comp_span(g));
    max_raw = std::max(max_raw, raw);
  }
  // A group is read, checked and decoded by one worker (the reads' kernel
  // copies run in parallel too), and, with sink_any_order, handed to the
  // sink there; in order then follow the whole-file hash over its bytes as
  // read, the in-order sink, and the progress.
  // The group's frames are consecutive chunks of the data section
  // (segments and their chunks tile it in order, check_tiling), decoded
  // one after the other into s.raw: passed on in one piece, so an export
  // writes them with one call and copies nothing into its buffer.
  auto data_offset = [&](const ItemGroup& g) {
    const PassUnit& u = units[g.first];
    return u.seg->data_begin + u.c * h.chunk_bytes;
  };
  run_pipeline(
      groups.size(), window, slots, workers, [](size_t, PassSlot&) {},
      [&](size_t gi, PassSlot& s, unsigned w) {
        const ItemGroup& g = groups[gi];
        const uint64_t base = units[g.first].read_from;
        const uint64_t n = comp_span(g);
        uint8_t* p = s.comp.reserve(n, max_comp);
        f->pread_exact(base, p, n);
        for (size_t k = 0; k < g.count; ++k) {
          const PassUnit& u = units[g.first + k];
          check_zero(p + (u.read_from - base), frame_of(u).offset - u.read_from, u.read_from);
        }
        decode_group(&units[g.first], g.count, s, ctxs.v[w], max_raw, dests);
        if (sink && sink_any_order) sink(s.raw.p.get(), s.raw.size, data_offset(g));
      },
      [&](size_t gi, PassSlot& s) {
        const ItemGroup& g = groups[gi];
        XXH64_update(fh, s.comp.p.get(), comp_span(g));
        if (sink && !sink_any_order) sink(s.raw.p.get(), s.raw.size, data_offset(g));
        done += s.produced;
        if (opt.progress) opt.progress(done, total);
      });
  // The same check for verify and export: the frames produced exactly the
  // data section the header declares.
  if (done != total)
    fail(ErrorKind::kBadInput, path + ": frames decode to " + std::to_string(done - (total - h.data_size)) +
                                   " bytes of data, the header declares " + std::to_string(h.data_size) +
                                   " (data corrupted)");
  // Padding before the header, the header and the hashed part of the trailer.
  const uint64_t pad_n = header_offset - pos;
  std::vector<uint8_t> padbuf(pad_n);
  f->pread_exact(pos, padbuf.data(), pad_n);
  check_zero(padbuf.data(), pad_n, pos);
  XXH64_update(fh, padbuf.data(), pad_n);
  {
    std::vector<uint8_t>().swap(padbuf);
    Buf hb;
    uint8_t* hp = hb.reserve((size_t)std::min<uint64_t>(header_size, 1 << 20));
    for (uint64_t off = 0; off < header_size;) {
      const size_t k = (size_t)std::min<uint64_t>(1 << 20, header_size - off);
      f->pread_exact(header_offset + off, hp, k);
      XXH64_update(fh, hp, k);
      off += k;
    }
  }
  XXH64_update(fh, trailer, kTrailerHashedSize);
  if (XXH64_digest(fh) != file_hash)
    fail(ErrorKind::kBadInput, path + ": whole-file checksum mismatch (the trailer is damaged)");
  return PassStats{total, f->size()};
}

void Reader::Impl::apply_ref_options(Reader& self, const ReadOptions& opt) {
  if (opt.any_reference_location) self.impl_->policy.any_location = true;
  if (!opt.ref_originals.empty() && opt.ref_originals.size() != opt.refs.size())
    fail(ErrorKind::kUsage, "reference originals: give one per reference file (--ref-original pairs with --ref)");
  if (!opt.refs.empty()) self.add_reference_paths(opt.refs);
  for (size_t i = 0; i < opt.ref_originals.size(); ++i) {
    if (opt.ref_originals[i].empty()) continue;
    self.add_reference_original(opt.refs[i], opt.ref_originals[i]);
    // Given by the caller: every predictor range read from it is checked
    // against the reference's block checksums (apply_prediction).
    Impl& m = *self.impl_;
    const uint64_t sum = Reader(opt.refs[i], 1).file_checksum();
    for (size_t k = 0; k < m.h.references.size(); ++k)
      if (m.h.references[k].xxh64 == sum && m.originals[k]) m.originals[k]->verify = true;
  }
}

PassStats Reader::export_safetensors(const std::string& out_path, const ReadOptions& opt) {
  Impl& m = *impl_;
  m.apply_ref_options(*this, opt);
  check_references();
  check_not_same_file(m.path, out_path);
  OutFile out(out_path, opt.force, m.path, opt.output_fd);
  uint8_t len[8];
  put_le64(len, m.h.safetensors_header.size());
  out.write(len, 8);
  out.write(m.h.safetensors_header.data(), m.h.safetensors_header.size());
  // A file (the temporary) takes each group at its offset from the worker
  // that decoded it, so the writes overlap the decoding instead of waiting
  // for the in-order stage (ext4 and tmpfs still copy one write of a file
  // at a time: bench/experiments/notebook.md); a stream (pipe, device, the caller's
  // descriptor) is written in order.
  const uint64_t base = out.offset();
  PassStats st;
  if (out.positional()) {
    out.flush();
    st = m.pass([&](const uint8_t* p, size_t n, uint64_t data_off) { out.write_at(p, n, base + data_off); }, opt,
                /*sink_any_order=*/true);
    out.end_positional();
  } else {
    st = m.pass([&](const uint8_t* p, size_t n, uint64_t) { out.write(p, n); }, opt);
  }
  if (out.offset() != original_size()) fail(ErrorKind::kInternal, out_path + ": exported size differs from the original");
  out.commit();
  return st;
}

PassStats Reader::read_all(const std::vector<TensorRead>& reads, const ReadOptions& opt) {
  Impl& m = *impl_;
  std::vector<uint8_t*> dests(m.h.tensors.size(), nullptr);
  for (const TensorRead& r : reads) {
    const TensorEntry& t = m.tensor_at(r.index);
    if (r.capacity < t.raw_size()) fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": destination too small");
    if (t.raw_size() && !r.dst) fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": null destination");
    if (dests[r.index]) fail(ErrorKind::kUsage, m.path + ": " + m.label(t) + ": read twice");
    dests[r.index] = static_cast<uint8_t*>(r.dst);
  }
  m.apply_ref_options(*this, opt);
  check_references();
  return m.pass(nullptr, opt, false, &dests);
}

PassStats Reader::verify(const std::string& original, const ReadOptions& opt) {
  Impl& m = *impl_;
  m.apply_ref_options(*this, opt);
  check_references();
  if (original.empty()) return m.pass(nullptr, opt);
  InFile orig(original);
  orig.advise_sequential();
  if (orig.size() != original_size())
    fail(ErrorKind::kBadInput, m.path + ": differs from " + original + " (sizes " + std::to_string(original_size()) +
                                   " and " + std::to_string(orig.size()) + ")");
  std::vector<uint8_t> buf(std::max<size_t>(8 + m.h.safetensors_header.size(), 1));
  orig.pread_exact(0, buf.data(), 8 + m.h.safetensors_header.size());
  uint8_t len[8];
  put_le64(len, m.h.safetensors_header.size());
  if (std::memcmp(buf.data(), len, 8) != 0 ||
      std::memcmp(buf.data() + 8, m.h.safetensors_header.data(), m.h.safetensors_header.size()) != 0)
    fail(ErrorKind::kBadInput, m.path + ": differs from " + original + " in the safetensors header");
  const uint64_t base = 8 + m.h.safetensors_header.size();
  return m.pass(
      [&](const uint8_t* p, size_t n, uint64_t data_off) {
        buf.resize(n);
        orig.pread_exact(base + data_off, buf.data(), n);
        if (std::memcmp(buf.data(), p, n) != 0) {
          size_t k = 0;
          while (buf[k] == p[k]) ++k;
          fail(ErrorKind::kBadInput, m.path + ": differs from " + original + " at byte " + std::to_string(base + data_off + k));
        }
      },
      opt);
}

}  // namespace tz::container

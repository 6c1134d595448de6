// Reader: references to other .tzip files (doc/container.md 12.3; resolved,
// opened and identified by file_refs.hpp) and applying predictions (12.1, 12.4).
#include "codec/predict.h"
#include "reader/reader_impl.hpp"

namespace tz::container {

void Reader::add_reference_original(const std::string& tzip_path, const std::string& st_path) {
  Impl& m = *impl_;
  Reader ref(tzip_path, 1);
  const uint64_t sum = ref.file_checksum();
  for (size_t i = 0; i < m.h.references.size(); ++i)
    if (m.h.references[i].xxh64 == sum) {
      auto o = std::make_unique<Impl::Original>();
      o->st = read_safetensors_info(st_path);
      for (size_t k = 0; k < o->st.tensors.size(); ++k) o->by_name.emplace(o->st.tensors[k].name, k);
      o->f = std::make_unique<InFile>(st_path);
      if (o->st.header_bytes != ref.safetensors_header() || o->f->size() != ref.original_size())
        fail(ErrorKind::kUsage, st_path + ": is not the safetensors file " + tzip_path +
                                    " decodes to (header or size differs)");
      std::lock_guard<std::mutex> lk(m.mu);
      m.originals[i] = std::move(o);
    }
}

void Reader::add_reference_path(const std::string& p) {
  Impl& m = *impl_;
  if (m.h.references.empty()) return;
  const uint64_t sum = Reader(p, 1).file_checksum();
  for (size_t i = 0; i < m.h.references.size(); ++i)
    if (m.h.references[i].xxh64 == sum) {
      std::unique_ptr<Reader> rd = refs::open_reference(m.path, m.h.references[i], p, m.policy, m.threads, m.chain);
      rd->impl_->policy = m.policy;
      std::lock_guard<std::mutex> lk(m.mu);
      m.ref_paths[i] = p;
      m.refs[i] = std::move(rd);
      return;
    }
  std::string names;
  for (const auto& r : m.h.references) names += (names.empty() ? "" : ", ") + r.file;
  fail(ErrorKind::kBadInput, m.path + ": " + p + " is not a reference of this file (it needs: " + names + ")");
}

void Reader::add_reference_paths(const std::vector<std::string>& paths) {
  Impl& m = *impl_;
  std::vector<std::pair<std::string, uint64_t>> v;
  for (const auto& p : paths) v.push_back({p, Reader(p, 1).file_checksum()});
  m.given_paths.insert(m.given_paths.end(), v.begin(), v.end());
  m.add_paths(v);
}

void Reader::Impl::collect_sums(std::vector<uint64_t>* out) {
  for (size_t i = 0; i < h.references.size(); ++i) {
    out->push_back(h.references[i].xxh64);
    if (!originals[i]) reference(i).impl_->collect_sums(out);
  }
}

void Reader::check_references() {
  for (size_t i = 0; i < impl_->h.references.size(); ++i)
    if (!impl_->originals[i]) impl_->reference(i).check_references();
  if (!impl_->given_paths.empty()) {
    std::vector<uint64_t> sums;
    impl_->collect_sums(&sums);
    for (const auto& gp : impl_->given_paths)
      if (std::find(sums.begin(), sums.end(), gp.second) == sums.end())
        fail(ErrorKind::kBadInput, impl_->path + ": " + gp.first + " is not a reference of this file or of its references");
  }
}

void Reader::Impl::apply_prediction(const TensorEntry& t, uint64_t off, uint8_t* io, uint64_t n) {
  if (t.predict.kind == PredictKind::kNone || n == 0) return;
  if (t.predict.ref >= 0 && originals[(size_t)t.predict.ref]) {
    // The reference's verified export: read the predictor bytes directly.
    const Original& o = *originals[(size_t)t.predict.ref];
    const std::string& sname = t.predict.kind == PredictKind::kCast ? t.predict.source : t.name;
    const TensorEntry* s = nullptr;
    if (const auto it = o.by_name.find(sname); it != o.by_name.end()) s = &o.st.tensors[it->second];
    const bool cast = t.predict.kind == PredictKind::kCast;
    if (!s || (cast ? (s->dtype != "F32" || s->shape != t.shape) : (s->dtype != t.dtype || s->shape != t.shape)))
      corrupt(t, "predictor tensor '" + sname + "' missing or of another dtype/shape in " + o.f->path());
    std::unique_ptr<uint8_t[]> scratch(new uint8_t[cast ? n * 2 : n]);  // not zero-filled
    uint8_t* tmp_p = scratch.get();
    o.f->pread_exact(o.st.data_start + s->data_begin + (cast ? off * 2 : off), tmp_p, cast ? n * 2 : n);
    if (o.verify) {
      Reader& rr = reference((size_t)t.predict.ref);
      const long ri = rr.find(sname);
      const uint64_t so = cast ? off * 2 : off, sn = cast ? n * 2 : n;
      const bool same = ri >= 0 && rr.check_bytes(
                                       (size_t)ri, so, sn,
                                       [&](uint64_t q, uint64_t len, uint8_t* dst) {
                                         o.f->pread_exact(o.st.data_start + s->data_begin + q, dst, len);
                                       },
                                       tmp_p);
      if (!same)
        fail(ErrorKind::kUsage, o.f->path() + ": tensor '" + sname + "' differs from " + ref_name((size_t)t.predict.ref) +
                                    " (block checksums): not the content of the reference");
    }
    if (cast)
      tz::predict::cast_xor(tmp_p, io, n / 2, t.dtype == "F16" ? tz::predict::kCastF16 : tz::predict::kCastBF16);
    else
      tz::predict::xor_bytes(tmp_p, io, n);
    return;
  }
  Reader* src_reader = nullptr;
  Impl* self_src = nullptr;
  if (t.predict.ref >= 0) src_reader = &reference((size_t)t.predict.ref);
  else self_src = this;
  const std::string& sname = t.predict.kind == PredictKind::kCast ? t.predict.source : t.name;
  const TensorEntry* s = nullptr;
  size_t sidx = 0;
  {
    const auto& list = self_src ? h.tensors : src_reader->tensors();
    long i = -1;
    if (self_src) {
      const auto it = h.by_name.find(sname);
      if (it != h.by_name.end()) i = (long)it->second;
    } else {
      i = src_reader->find(sname);
    }
    if (i >= 0) s = &list[(size_t)i], sidx = (size_t)i;
  }
  const std::string where = self_src ? path : ref_name((size_t)t.predict.ref);
  if (!s) corrupt(t, "predictor tensor '" + sname + "' not found in " + where);
  // Bytes [o, o + len) of the predictor tensor from another file: straight
  // into the buffer when they are whole blocks (no bounce copy).
  auto read_ref = [&](uint64_t o, uint64_t len, uint8_t* dst) {
    const uint64_t bb = s->block_bytes();
    if (o % bb == 0 && (len % bb == 0 || o + len == s->raw_size()))
      src_reader->read_blocks(sidx, o / bb, (len + bb - 1) / bb, dst, len);
    else
      src_reader->read_range(sidx, o, len, dst);
  };
  std::unique_ptr<uint8_t[]> tmp_buf;  // not zero-filled
  if (t.predict.kind == PredictKind::kCast) {
    if (s->dtype != "F32" || s->shape != t.shape)
      corrupt(t, "cast source '" + sname + "' in " + where + " is not an FP32 tensor of the same shape");
    tmp_buf.reset(new uint8_t[n * 2]);
    uint8_t* tmp = tmp_buf.get();
    if (self_src) {
      size_t w = 0;
      const uint64_t bb = s->block_bytes(), so = off * 2, se = so + n * 2;
      const uint64_t fb = so / bb, lb = (se - 1) / bb;
      std::vector<uint8_t> blk((lb - fb + 1) * bb);
      read_blocks_into(*s, sidx, fb, lb - fb + 1, blk.data(), blk.size(), &w);
      std::memcpy(tmp, blk.data() + (so - fb * bb), n * 2);
    } else {
      read_ref(off * 2, n * 2, tmp);
    }
    tz::predict::cast_xor(tmp, io, n / 2, t.dtype == "F16" ? tz::predict::kCastF16 : tz::predict::kCastBF16);
  } else {
    if (s->dtype != t.dtype || s->shape != t.shape)
      corrupt(t, "delta reference tensor in " + where + " has a different dtype or shape");
    // In pieces of whole blocks (about 1 MiB): each piece is decoded into a
    // buffer that stays in cache and XORed into io at once.
    const uint64_t bb = s->block_bytes();
    const uint64_t piece = off % bb == 0 ? std::max<uint64_t>(bb, (UINT64_C(1) << 20) / bb * bb) : n;
    tmp_buf.reset(new uint8_t[std::min(piece, n)]);
    for (uint64_t done = 0; done < n;) {
      const uint64_t len = std::min(piece, n - done);
      read_ref(off + done, len, tmp_buf.get());
      tz::predict::xor_bytes(tmp_buf.get(), io + done, len);
      done += len;
    }
  }
}

}  // namespace tz::container

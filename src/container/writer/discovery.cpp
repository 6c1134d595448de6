// The writer's prediction discovery (doc/container.md section 12), for every
// .tzip the library writes (TensorWriter, and through it compress_file and
// compress_checkpoint), with the shared rules of prediction.hpp:
//  - cast: a BF16/F16 tensor that find_cast_source finds to be the RNE cast
//    of an FP32 tensor of the same shape (this file's, or one of another
//    file of the same checkpoint, recorded as a reference);
//  - delta (PredictionRules::ref): the tensor of the same name, dtype and
//    shape in the previous checkpoint's .tzip, sampled on one block.
#include <algorithm>
#include <map>

#include "internal.hpp"
#include "writer/writer_impl.hpp"

namespace tz::container::detail {

namespace {

// An FP32 tensor a cast may come from.
struct CastCandidate {
  const TensorEntry* t;
  ByteSource bytes;
  int other;                   // -1: an item of this file, else the index in `others`
  Buf probe;                   // its probe range, read once (file-backed candidates)
};

bool ends_with(const std::string& a, const std::string& b) {
  return a.size() > b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0;
}

// The cast source of items[i] (a BF16/F16 tensor whose bytes the writer
// reads), or -1: an index into cands.
long find_cast(const WriterItem& t, int kind, std::vector<CastCandidate>& cands, const PredictionRules& rules,
               CastScratch* scratch) {
  std::vector<size_t> order;  // candidates of the target's shape, in the order tried
  for (size_t j = 0; j < cands.size(); ++j)
    if (cands[j].t->shape == t.e.shape && (!rules.name_first || ends_with(cands[j].t->name, t.e.name)))
      order.push_back(j);
  if (rules.name_first)
    for (size_t j = 0; j < cands.size(); ++j)
      if (cands[j].t->shape == t.e.shape && !ends_with(cands[j].t->name, t.e.name)) order.push_back(j);
  if (order.empty()) return -1;
  CastData cd;
  cd.read_target = [&](uint64_t first, uint64_t count, uint8_t* dst) { t.bytes.read(first * 2, count * 2, dst); };
  cd.cand_probe = [&](size_t i, uint64_t first, uint64_t count) -> const uint8_t* {
    CastCandidate& c = cands[order[i]];
    if (c.bytes.data) return c.bytes.data + first * 4;
    if (!c.probe.p) c.bytes.view(first * 4, count * 4, c.probe);  // same shape: the same range for every target
    return c.probe.p.get();
  };
  cd.read_cand = [&](size_t i, uint64_t first, uint64_t count, uint8_t* dst) {
    cands[order[i]].bytes.read(first * 4, count * 4, dst);
  };
  const long w = find_cast_source(t.e.raw_size() / 2, kind, rules.min_gain, order.size(), cd,
                                  /*stop_at_exact=*/rules.name_first, scratch);
  return w < 0 ? -1 : (long)order[(size_t)w];
}

// Whether items' tensor t is stored as a delta against the reference's
// tensor ri: the min_gain rule on the first 16384 elements of the
// reference's middle block, read from ref_original when it holds the tensor
// (the same bytes), else decoded (that one block).
bool delta_sample_pays(const WriterItem& t, size_t ri, unsigned esz, Predictions& p, double min_gain) {
  const TensorEntry& rt = p.dref->tensors()[ri];
  const DeltaWindow dw = delta_window(rt, esz);
  std::vector<uint8_t> cur(dw.elems * esz), ref;
  t.bytes.read(dw.first * esz, cur.size(), cur.data());
  const TensorEntry* ot = nullptr;
  if (p.dref_orig)
    for (const auto& e : p.dref_orig->info().tensors)
      if (e.name == t.e.name && e.dtype == t.e.dtype && e.shape == t.e.shape) ot = &e;
  if (ot) {
    ref.resize(cur.size());
    p.dref_orig->file().pread_exact(p.dref_orig->tensor_offset(*ot) + dw.first * esz, ref.data(), ref.size());
    return delta_pays(cur.data(), ref.data(), dw.elems, esz, min_gain);
  }
  ref.resize(dw.blk_len);
  p.dref->read_range(ri, dw.blk_off, dw.blk_len, ref.data());  // exactly one block
  return delta_pays(cur.data(), ref.data() + (dw.first * esz - dw.blk_off), dw.elems, esz, min_gain);
}

// Records the references the predictions use, in first-use order (items in
// file order), and sets each prediction's index into them.
void record_references(std::vector<WriterItem>& items, const std::vector<CastSourceFile>& others,
                       const PredictionRules& rules, const std::string& path, Predictions& p, TzipHeader* h) {
  int delta_index = -1;
  std::map<size_t, int> other_index;
  for (auto& it : items) {
    Prediction& pr = it.e.predict;
    if (pr.kind == PredictKind::kNone || pr.ref == -1) continue;
    if (pr.ref == -2) {
      if (delta_index < 0) {
        delta_index = (int)h->references.size();
        h->references.push_back(
            Reference{relative_path(rules.ref, path), p.dref->file_checksum(), true, p.dref->header_checksum()});
      }
      pr.ref = delta_index;
    } else {
      const size_t oi = (size_t)pr.ref;
      auto f = other_index.find(oi);
      if (f == other_index.end()) {
        f = other_index.emplace(oi, (int)h->references.size()).first;
        h->references.push_back(
            Reference{relative_path(others[oi].tzip_path, path), others[oi].xxh64, true, others[oi].header_xxh64});
      }
      pr.ref = f->second;
    }
  }
  for (const auto& it : items)
    if (it.e.predict.kind != PredictKind::kNone) h->major = kTzipVersionMajorPredicted;
}

}  // namespace

void find_predictions(std::vector<WriterItem>& items, const std::vector<CastSourceFile>& others,
                      const PredictionRules& rules, const std::string& path, TzipHeader* h, Predictions* out) {
  Predictions& p = *out;
  if (!rules.ref_original.empty() && rules.ref.empty())
    fail(ErrorKind::kUsage, path + ": ref_original needs ref (the previous checkpoint's .tzip)");
  if (!rules.ref.empty()) {
    check_not_same_file(rules.ref, path);  // the new file would replace its own reference
    p.dref = std::make_unique<Reader>(rules.ref, 1);
    ReaderAccess::verify_frames_on_use(*p.dref);  // its header checksum is recorded
    if (!rules.ref_original.empty())
      p.dref_orig = std::make_unique<RefOriginal>(rules.ref_original, *p.dref, rules.ref);
  }
  std::vector<CastCandidate> cands;
  if (rules.predict) {
    for (const auto& it : items)
      if (it.src == WriterSource::kHost && it.e.dtype == "F32" && it.e.raw_size() > 0)
        cands.push_back(CastCandidate{&it.e, it.bytes, -1, {}});
    for (size_t i = 0; i < others.size(); ++i) {
      p.other_files.push_back(std::make_unique<InFile>(others[i].st_path));
      for (const auto& t : others[i].st.tensors)
        if (t.dtype == "F32" && t.raw_size() > 0)
          cands.push_back(CastCandidate{&t, ByteSource{nullptr, p.other_files.back().get(), others[i].st.data_start +
                                                                                              t.data_begin},
                                        (int)i, {}});
    }
  }
  CastScratch scratch;
  for (auto& it : items) {
    if (it.src != WriterSource::kHost || it.e.is_gap || it.e.raw_size() == 0) continue;
    const unsigned bits = dtype_bits(it.e.dtype);
    if (bits == 0 || bits % 8 != 0) continue;  // sub-byte dtypes: never predicted
    const int kind = cast_kind(it.e.dtype);
    const long c = kind >= 0 && !cands.empty() ? find_cast(it, kind, cands, rules, &scratch) : -1;
    if (c >= 0) {
      it.cast_src = cands[(size_t)c].bytes;
      it.e.predict = Prediction{PredictKind::kCast, cands[(size_t)c].other, cands[(size_t)c].t->name};
      ++p.casts;
      continue;
    }
    if (!p.dref) continue;
    const long ri = p.dref->find(it.e.name);
    if (ri < 0) continue;
    const TensorEntry& rt = p.dref->tensors()[(size_t)ri];
    if (rt.dtype != it.e.dtype || rt.shape != it.e.shape) continue;
    if (!delta_sample_pays(it, (size_t)ri, bits / 8, p, rules.min_gain)) continue;
    it.delta_of = ri;
    it.e.predict = Prediction{PredictKind::kDelta, -2, {}};  // the reference's index: set below
    ++p.deltas;
  }
  record_references(items, others, rules, path, p, h);
}

}  // namespace tz::container::detail

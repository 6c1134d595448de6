// Calibration: tables for the page codec from a sample of real pages
// (doc/kv.md 4.1). Integer arithmetic only, so that every machine learns
// the same tables from the same sample.
#include <algorithm>
#include <string>

#include "codec/cost.h"
#include "cpu/frame.h"
#include "kv/codec.hpp"

namespace tz::kv {
namespace {

// Histograms of each field stream of the sample, split in chunks.
void stream_histograms(const uint8_t* src, size_t n_elems, uint8_t dtype, uint64_t (*hist)[256]) {
  constexpr uint32_t kChunk = 1u << 16;
  const size_t es = dtype_elem_size(dtype);
  const int K = dtype_stream_count(dtype);
  std::vector<uint8_t> buf((size_t)K * kChunk);
  uint8_t* streams[kMaxStreams];
  for (int k = 0; k < K; ++k) streams[k] = buf.data() + (size_t)k * kChunk;
  for (size_t off = 0; off < n_elems; off += kChunk) {
    const uint32_t n = (uint32_t)std::min<size_t>(kChunk, n_elems - off);
    split_fields(dtype, src + off * es, n, streams);
    for (int k = 0; k < K; ++k)
      for (uint32_t i = 0; i < n; ++i) ++hist[k][streams[k][i]];
  }
}

// A stream is entropy coded when its sample would take at most 94% of its
// raw size (before the 128 bytes of lane states per page): below that the
// decode time is better spent on a copy.
constexpr uint64_t kCodePercent = 94;

void rans_stream_table(const uint64_t* hist_in, KvStreamTable* st) {
  uint64_t hist[256];
  uint64_t total = 0;
  int absent = -1;
  for (int s = 0; s < 256; ++s) {
    hist[s] = hist_in[s];
    total += hist[s];
    if (!hist[s] && absent < 0) absent = s;
  }
  st->kind = kKindRaw;
  st->has_escape = 0;
  st->escape = 0;
  for (int s = 0; s < 256; ++s) st->freq[s] = 0;
  if (total == 0) return;
  if (absent >= 0) {
    // The escape stands for every symbol the sample lacked: about 1/4096 of
    // the probability (its frequency rounds to 1 unless the sample is tiny).
    st->has_escape = 1;
    st->escape = (uint8_t)absent;
    hist[absent] = std::max<uint64_t>(1, total >> kProbBits);
  }
  uint32_t freq[256];
  rans_normalize(hist, freq);
  uint64_t hi, lo;
  coded_bits_fix16(hist_in, freq, &hi, &lo);
  const unsigned __int128 bits = ((unsigned __int128)hi << 64) | lo;
  const unsigned __int128 raw_bits = (unsigned __int128)total * 8 * 65536;
  if (bits * 100 >= raw_bits * kCodePercent) {
    st->has_escape = 0;
    st->escape = 0;
    return;
  }
  st->kind = kKindRans;
  for (int s = 0; s < 256; ++s) st->freq[s] = freq[s];
}

// Fixed mode: the 2^bits - 1 commonest symbols get codes (commonest first,
// ties to the lower symbol); bits minimises bits + 8 x (escape share) over
// the sample unless the caller fixed it. Unused codes name absent symbols
// (lowest first) so that every code is defined.
void fixed_table(const uint64_t* hist, unsigned want_bits, KvTables* t) {
  int order[256] = {};
  for (int s = 0; s < 256; ++s) order[s] = s;
  std::stable_sort(order, order + 256, [&](int a, int b) { return hist[a] > hist[b]; });
  uint64_t total = 0;
  for (int s = 0; s < 256; ++s) total += hist[s];
  uint32_t best = want_bits;
  if (!best) {
    uint64_t best_cost = UINT64_MAX;
    for (uint32_t bits = 1; bits <= kMaxFixedBits; ++bits) {
      uint64_t covered = 0;
      for (uint32_t c = 0; c < fixed_escape_code(bits); ++c) covered += hist[order[c]];
      const uint64_t cost = bits * total + 8 * (total - covered);  // bits per element x total
      if (cost < best_cost) {
        best_cost = cost;
        best = bits;
      }
    }
  }
  if (best < 1 || best > kMaxFixedBits) best = 3;  // (callers pass 0..7)
  t->fixed_bits = (uint8_t)best;
  for (uint32_t c = 0; c < fixed_escape_code(best); ++c) t->fixed_sym[c] = (uint8_t)order[c];
}

}  // namespace

size_t Codec::calibrate(std::unique_ptr<Codec>* out, const uint8_t* sample, size_t size, uint8_t dtype,
                        const tz_kv_params& p) {
  if (!kv_dtype_ok(dtype))
    return cpu::make_error(kErrUnsupported, std::string("KV codec: dtype ") + tz_dtype_name((tz_dtype)dtype) +
                                                " is not supported (bf16, f16, f8_e4m3, f8_e5m2)");
  const size_t es = dtype_elem_size(dtype);
  if (!sample || size == 0 || size % es)
    return cpu::make_error(kErrBadParam, "KV calibration: the sample must hold at least one element (" +
                                             std::to_string(size) + " bytes given, element size " +
                                             std::to_string(es) + ")");
  const int mode = p.mode ? (int)p.mode : (int)TZ_KV_MODE_RANS;
  if (mode != TZ_KV_MODE_RANS && mode != TZ_KV_MODE_FIXED)
    return cpu::make_error(kErrBadParam, "KV calibration: unknown mode " + std::to_string(mode));
  if (p.fixed_bits > kMaxFixedBits)
    return cpu::make_error(kErrBadParam, "KV calibration: fixed_bits must be 0..7, got " + std::to_string(p.fixed_bits));
  if (p.n_row_dims > (unsigned)kMaxRowDims)
    return cpu::make_error(kErrBadParam, "KV calibration: at most 4 row dims");
  KvTables t{};
  t.dtype = dtype;
  t.mode = (uint8_t)(mode == TZ_KV_MODE_FIXED ? kModeFixedTables : kModeRansTables);
  t.flags = p.no_checksum ? 0 : kFlagChecksum;
  t.n_streams = (uint8_t)dtype_stream_count(dtype);
  t.n_row_dims = (uint8_t)p.n_row_dims;
  for (unsigned d = 0; d < p.n_row_dims; ++d) {
    if (p.row_dims[d] == 0) return cpu::make_error(kErrBadParam, "KV calibration: a row dim is 0");
    t.row_dims[d] = p.row_dims[d];
  }
  std::vector<uint64_t> h((size_t)kMaxStreams * 256, 0);
  auto* hist = reinterpret_cast<uint64_t(*)[256]>(h.data());
  stream_histograms(sample, size / es, dtype, hist);
  if (t.mode == kModeFixedTables)
    fixed_table(hist[0], p.fixed_bits, &t);
  else
    for (int k = 0; k < t.n_streams; ++k) rans_stream_table(hist[k], &t.st[k]);
  *out = from_tables(t);
  return 0;
}

}  // namespace tz::kv

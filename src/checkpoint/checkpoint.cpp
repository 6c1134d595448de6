// Checkpoint save pipeline (doc/checkpoint.md): the codec choice for kAuto
// (time model, bandwidth probe, calibration), the rank file, save() and
// commit(). The other parts of the engine are listed in checkpoint_internal.hpp.
//
// Save: tensors are cut into chunks of chunk_bytes (the .tzip chunking);
// `threads` workers encode chunks (one single-threaded tz_ctx each) into a
// ring of `slots` reusable buffers, while the writer thread, in data order,
// hashes each finished frame and queues it on the storage back end
// (src/io/write_queue.hpp); a slot is reused once its write completed. So
// encode of chunk k+1.. overlaps the write of chunk k, and memory is
// slots x tz_compress_bound(chunk_bytes) whatever the checkpoint size.
// The rank file is a valid .tzip container (doc/container.md sections 2-3),
// written under a temporary name, fsync'd and renamed; the manifest, which
// also indexes every frame, is validated with the same rules restore applies
// (manifest.cpp) and written last with temp + fsync + rename + fsync(dir).
#include "tensorzip/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "../container/output.hpp"
#include "codec/policy.h"
#include "../io/queue_sink.hpp"
#include "../io/write_queue.hpp"
#include "checkpoint_internal.hpp"
#include "manifest.hpp"
#include "checkpoint/codec_choice.hpp"
#include "references.hpp"
#include "tensorzip/container.hpp"
#include "tensorzip/tensorzip.h"

#ifdef TZ_CHECKPOINT_CUDA
#include "checkpoint_gpu.hpp"
#endif

namespace tz::checkpoint {

namespace detail {

[[noreturn]] void rethrow_container(const tz::container::Error& e) {
  using CK = tz::container::ErrorKind;
  const int en = e.sys_errno();
  ErrorKind k = ErrorKind::kInternal;
  switch (e.kind()) {
    case CK::kUsage:
    case CK::kBadInput: k = ErrorKind::kUsage; break;
    case CK::kIO:
    case CK::kExists: k = (en == ENOSPC || en == EFBIG || en == EDQUOT) ? ErrorKind::kNoSpace : ErrorKind::kIO; break;
    default: k = ErrorKind::kInternal;
  }
  throw Error(k, e.what());
}

tz::io::GdsDecision gds_decision(Io io) {
  tz::io::GdsDecision d;
  if (io != Io::kGds) return d;
#ifdef TZ_CHECKPOINT_CUDA
  const char* lib = std::getenv("TZ_CUFILE_LIB");
  return tz::io::decide_gds(true, gpu::device_count(), lib && *lib ? lib : "libcufile.so.0");
#else
  d.reason = "built without CUDA";
  return d;
#endif
}

}  // namespace detail

using namespace detail;
using nlohmann::json;
namespace tzd = tz::container::detail;  // output temporaries (src/container/output.hpp)

namespace {

void fsync_path(const std::string& p, bool dir) {
  const int fd = ::open(p.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) fail_errno(p, "open for fsync", errno);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    fail_errno(p, "fsync", e);
  }
  ::close(fd);
}

// Writes `text` to dir/name atomically: temp + fsync + rename + fsync(dir).
// The temporary is the container's (unpredictable name, O_EXCL|O_NOFOLLOW,
// removed on every failure path); those a killed process left for this name
// are removed first.
void write_atomic(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string fin = dir + "/" + name;
  try {
    tzd::remove_stale_temporaries(fin);
    int fd = -1;
    tzd::Temporary tmp = tzd::Temporary::create_file(fin, &fd);
    int err = tz::io::pwrite_full(fd, text.data(), text.size(), 0);
    if (!err) tzd::apply_attrs(fd, tzd::attrs_of(""), fin);
    if (!err && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    if (err) fail_errno(fin, "write", err);
    tzd::publish(tmp.path(), fin, /*force=*/true, /*is_dir=*/false);  // rename, fsync(dir)
    tmp.release();
  } catch (const tz::container::Error& e) {
    fail(ErrorKind::kIO, e.what());
  }
}

// ---- codec choice for kAuto ----------------------------------------------
std::mutex g_bw_mu;
std::map<std::string, double> g_bw_cache;  // folder -> GiB/s

// Measured in the checkpoint's folder; cached by its parent (the folder that
// holds successive checkpoints), so a training run pays for it once.
double probe_storage_gibps(const std::string& dir) {
  std::lock_guard<std::mutex> lk(g_bw_mu);
  const std::string key = parent_of(dir);
  auto it = g_bw_cache.find(key);
  if (it != g_bw_cache.end()) return it->second;
  int fd = -1;
  tzd::Temporary probe;  // removed on return
  try {
    tzd::remove_stale_temporaries(dir + "/bw-probe");  // a killed probe's
    probe = tzd::Temporary::create_file(dir + "/bw-probe", &fd);
  } catch (const tz::container::Error& e) {
    fail(ErrorKind::kIO, e.what());
  }
  const std::string& p = probe.path();
  // Large enough to get past the first burst of a device's or the page
  // cache's write-back; still an estimate: pass storage_gibps when known.
  constexpr size_t kProbe = 128u << 20, kBuf = 4u << 20;
  std::vector<uint8_t> buf(kBuf);
  for (size_t i = 0; i < kBuf; ++i) buf[i] = (uint8_t)(i * 2654435761u >> 13);  // not all zeros
  const auto t0 = Clock::now();
  int err = 0;
  for (size_t off = 0; off < kProbe && !err; off += kBuf) err = tz::io::pwrite_full(fd, buf.data(), kBuf, off);
  if (!err && ::fdatasync(fd) != 0) err = errno;
  const double t = secs(t0, Clock::now());
  ::close(fd);
  if (err) fail_errno(p, "bandwidth probe", err);
  const double bw = kProbe / kGiB / std::max(t, 1e-6);
  g_bw_cache[key] = bw;
  return bw;
}

}  // namespace

// ===========================================================================
// Save
// ===========================================================================
namespace {

struct Seg {
  const TensorView* t = nullptr;
  tz_dtype cd = TZ_DTYPE_BYTES;
  unsigned block_elems = 0;
  uint64_t data_begin = 0;
};

struct Unit {
  size_t seg;
  uint64_t off;
  size_t n;
};

void validate(std::span<const TensorView> tensors, std::vector<Seg>& segs) {
  std::set<std::string> names;
  uint64_t pos = 0;
  for (const auto& t : tensors) {
    if (t.name.empty()) fail(ErrorKind::kUsage, "tensor with an empty name");
    if (!names.insert(t.name).second) fail(ErrorKind::kUsage, "duplicate tensor name '" + t.name + "'");
    Seg s;
    s.t = &t;
    if (!tz::container::codec_dtype_for(t.dtype, &s.cd))
      fail(ErrorKind::kUsage, "tensor '" + t.name + "': unknown dtype '" + t.dtype + "'");
    const unsigned bits = tz::container::dtype_bits(t.dtype);
    unsigned __int128 n = bits;
    for (uint64_t d : t.shape) {
      n *= d;
      if (n > ((unsigned __int128)1 << 70)) fail(ErrorKind::kUsage, "tensor '" + t.name + "': shape too large");
    }
    if (n % 8 != 0 || (uint64_t)(n / 8) != t.size)
      fail(ErrorKind::kUsage, "tensor '" + t.name + "': size " + std::to_string(t.size) +
                                  " bytes does not match its dtype and shape");
    if (t.size && !t.data) fail(ErrorKind::kUsage, "tensor '" + t.name + "': null data");
#ifndef TZ_CHECKPOINT_CUDA
    if (t.memory == Memory::kDevice)
      fail(ErrorKind::kUsage, "tensor '" + t.name + "' is in device memory but tensorzip was built without CUDA");
#endif
    s.block_elems = tz::policy_block_elems(0, (uint8_t)s.cd);  // the codec's default
    s.data_begin = pos;
    pos += t.size;
    segs.push_back(std::move(s));
  }
}

struct Choice {
  int level = -1;
  std::string name, model;
};

// Level-1 encode throughput per worker thread that a save of this process
// really achieved (GiB/s; the workers share cores, caches and memory
// bandwidth with the writer, the kernel's copies and other processes, which
// a short calibration on a warm sample does not see); 0 until a level-1 save
// of at least 64 MiB finished. Later kAuto choices use it instead of the
// calibrated level-1 speed, and scale level 2 by the calibrated ratio.
std::mutex g_enc_mu;
double g_enc_obs = 0;

Choice pick_codec(const std::string& dir, const std::vector<Seg>& segs, const std::vector<Unit>& units,
                  uint64_t raw_total, const SaveOptions& opt, unsigned threads, double* cal_gibps) {
  Choice c;
  if (opt.codec == Codec::kRaw) return {-1, "raw", "forced: raw"};
  if (opt.codec == Codec::kFast) return {1, "fast", "forced: fast (level 1)"};
  if (opt.codec == Codec::kStrong) return {2, "strong", "forced: strong (level 2)"};
  // Byte-weighted sample: the chunks that hold bytes S*i/k, i = 0..k-1, so
  // that dtypes and small tensors (whose per-frame overhead is higher) weigh
  // as much as their share of the bytes. Each sampled chunk stands for S/k
  // bytes: time and compressed size are estimated as sum(x_i / n_i) * S/k.
  constexpr int kSamples = 8;
  std::unique_ptr<tz_ctx, void (*)(tz_ctx*)> ctx(tz_ctx_create(1), &tz_ctx_free);
  double per_byte_t[2] = {0, 0}, per_byte_c[2] = {0, 0}, sampled = 0;
  int used = 0;
  std::vector<uint8_t> comp;
  size_t ui = 0;
  uint64_t unit_end = units.empty() ? 0 : units[0].n;
  for (int i = 0; i < kSamples && !units.empty(); ++i) {
    const uint64_t at = raw_total * (uint64_t)i / kSamples;
    while (ui + 1 < units.size() && unit_end <= at) unit_end += units[++ui].n;
    const Unit& u = units[ui];
    const Seg& s = segs[u.seg];
    if (s.t->memory != Memory::kHost || u.n == 0) continue;
    if (comp.size() < tz_compress_bound(u.n)) comp.resize(tz_compress_bound(u.n));
    for (int l = 0; l < 2; ++l) {
      tz_params p{};
      p.dtype = s.cd;
      p.level = l + 1;
      p.block_elems = s.block_elems;
      const auto t0 = Clock::now();
      const size_t r = tz_ctx_compress(ctx.get(), comp.data(), comp.size(),
                                       static_cast<const uint8_t*>(s.t->data) + u.off, u.n, &p);
      const double dt = secs(t0, Clock::now());
      if (tz_is_error(r)) fail(ErrorKind::kInternal, std::string("calibration: ") + tz_get_error_name(r));
      per_byte_t[l] += dt / (double)u.n;
      per_byte_c[l] += (double)r / (double)u.n;
    }
    sampled += (double)u.n;
    ++used;
  }
  const double bw = opt.storage_gibps > 0 ? opt.storage_gibps : probe_storage_gibps(dir);
  if (used == 0) return {-1, "raw", "no host data to calibrate the codec on: raw"};
  double obs = 0;
  {
    std::lock_guard<std::mutex> lk(g_enc_mu);
    obs = g_enc_obs;
  }
  // Per-byte means over the sample -> aggregate speed (GiB/s) and ratio.
  double e[2], r[2];
  for (int l = 0; l < 2; ++l) {
    e[l] = used / per_byte_t[l] / kGiB * threads;
    r[l] = used / per_byte_c[l];
  }
  *cal_gibps = e[0];
  const double factor = obs > 0 ? obs * threads / e[0] : 0;
  if (factor > 0) e[0] *= factor, e[1] *= factor;
  const CodecChoice cc = choose_codec((double)raw_total, bw, e[0], r[0], e[1], r[1]);
  c.level = codec_kind_level(cc.kind);
  c.name = codec_kind_name(cc.kind);
  char fb[128] = "";
  if (factor > 0)
    std::snprintf(fb, sizeof fb, ", speeds scaled by %.2f to the level-1 throughput a previous save achieved", factor);
  c.model = std::string(opt.storage_gibps > 0 ? "storage bandwidth given; " : "storage bandwidth measured; ") +
            "codec calibrated on " + std::to_string(used) + " chunks (" + std::to_string((uint64_t)sampled) +
            " bytes, byte-weighted) x " + std::to_string(threads) + " threads" + fb + ": " + cc.model;
  return c;
}

void ensure_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) fail_errno(dir, "mkdir", errno);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) fail(ErrorKind::kIO, dir + ": not a directory");
}

// The container writer's options for this save: codec level, pool, ring of
// slots, prediction, and the src/io write queue as its sink.
tz::container::TensorWriterOptions writer_options(const SaveOptions& opt, const Choice& choice, unsigned threads) {
  tz::container::TensorWriterOptions wo;
  wo.level = choice.level;
  wo.threads = threads;
  wo.chunk_bytes = opt.chunk_bytes;
  wo.slots = (unsigned)std::max<size_t>(2, opt.slots ? opt.slots : threads + 4);
  wo.force = true;  // a rank file of an interrupted save (no manifest) is replaced
  wo.metadata = opt.metadata;
  wo.created_by = "tensorzip checkpoint";
  wo.predict = opt.predict;
  wo.direct_io = opt.direct_io;
  const tz::io::Backend be = opt.io == Io::kPosix  ? tz::io::Backend::kPosix
                             : opt.io == Io::kUring ? tz::io::Backend::kUring
                                                    : tz::io::Backend::kAuto;  // kAuto, kGds
  const unsigned io_threads = std::max(1u, opt.io_threads);
  const unsigned depth = (unsigned)std::min<size_t>(std::max<size_t>(wo.slots, 4), 64);
  wo.sink = [be, io_threads, depth](int fd, bool direct) -> std::unique_ptr<tz::container::Sink> {
    return std::make_unique<tz::io::QueueSink>(fd, be, io_threads, depth, /*writeback=*/!direct);
  };
  return wo;
}

// Writes the tensors to `fin` with the container's TensorWriter (host
// tensors encoded by its pool, device tensors by the GPU encoder);
// *stored: the tensors as stored.
tz::container::TensorWriterStats write_tensors(const std::string& fin, const tz::container::TensorWriterOptions& wo,
                                               const std::vector<Seg>& segs,
                                               std::vector<tz::container::TensorEntry>* stored) {
  try {
    tz::container::TensorWriter w(fin, wo);
#ifdef TZ_CHECKPOINT_CUDA
    // Device tensors: batched GPU encode into pinned buffers, handed to the
    // writer chunk by chunk as encoded frames (gpu::WriterEncoder).
    gpu::WriterEncoder genc(wo.level);
    bool any_dev = false;
#endif
    for (size_t i = 0; i < segs.size(); ++i) {
      const Seg& s = segs[i];
#ifdef TZ_CHECKPOINT_CUDA
      if (s.t->memory == Memory::kDevice) {
        genc.add(w, s.t->name, s.t->dtype, s.t->shape, s.t->data, s.t->size, s.block_elems);
        any_dev = true;
        continue;
      }
#endif
      w.add(s.t->name, s.t->dtype, s.t->shape, s.t->data, s.t->size);
    }
#ifdef TZ_CHECKPOINT_CUDA
    if (any_dev) genc.start();
#endif
    const tz::container::TensorWriterStats ws = w.finish();
    *stored = w.tensors();
    return ws;
  } catch (const tz::container::Error& e) {
    rethrow_container(e);
  }
}

// SaveStats from the writer's, the log lines, and the throughput feedback
// for later kAuto choices.
void record_stats(const SaveOptions& opt, const Choice& choice, unsigned threads, uint64_t data_size,
                  Clock::time_point t_pipe, const tz::container::TensorWriterStats& ws, SaveStats& stats) {
  stats.io = ws.io;
  if (opt.io == Io::kGds) {
    const auto g = gds_decision(opt.io);
    stats.io += g.use ? " (cuFile available; frames are checksummed in host memory, so they are written from pinned "
                        "host buffers)"
                      : " (cuFile not used: " + g.reason + ")";
    if (opt.log) opt.log("io: " + stats.io);
  }
  stats.predicted = ws.predicted;
  stats.deltas = ws.deltas;
  stats.raw_bytes = data_size;
  stats.file_bytes = ws.file_bytes;
  // Feedback for later kAuto choices: level-1 throughput per worker that
  // this save achieved, over the whole pipeline's time (encode is what
  // limits a CPU-bound save; an I/O-bound one understates it, which only
  // makes later choices more cautious).
  if (choice.level == 1 && data_size >= (64u << 20)) {
    const double wall = secs(t_pipe, Clock::now());
    const double achieved = (double)data_size / kGiB / wall / threads;
    std::lock_guard<std::mutex> lk(g_enc_mu);
    g_enc_obs = achieved;
  }
  if (opt.log && choice.level >= 0)
    opt.log("encode: " + std::to_string(threads) + " workers, " + std::to_string((uint64_t)(ws.encode_seconds * 1000)) +
            " ms of encode time in total for " + std::to_string(data_size) + " bytes; " +
            std::to_string(ws.predicted) + " tensors stored as cast residuals, " + std::to_string(ws.deltas) +
            " as delta residuals; io " + ws.io);
}

// Writes this rank's .tzip file with the container's TensorWriter (encode
// over a thread pool into a bounded ring of buffers, writes queued on the
// src/io back end, temp + fsync + rename); returns the rank's manifest
// entry, checked with the rules restore applies.
json write_rank_file(const std::string& dir, std::span<const TensorView> tensors, const SaveOptions& opt,
                     SaveStats& stats) {
  const uint64_t chunk = opt.chunk_bytes;
  tz::container::check_chunk_bytes(chunk);
  std::vector<Seg> segs;
  validate(tensors, segs);
  uint64_t data_size = 0;
  std::vector<Unit> units;
  for (size_t i = 0; i < segs.size(); ++i) {
    const uint64_t n = segs[i].t->size;
    for (uint64_t off = 0; off < n; off += chunk) units.push_back({i, off, (size_t)std::min<uint64_t>(chunk, n - off)});
    data_size += n;
  }
  SaveReference ref;  // the previous checkpoint (SaveOptions::ref), checked before any work
  if (!opt.ref.empty()) ref = resolve_save_reference(opt.ref, dir, opt.rank);
  const unsigned threads = resolve_threads(opt.threads);
  double cal_gibps = 0;  // level-1 calibration (kAuto only)
  const Choice choice = pick_codec(dir, segs, units, data_size, opt, threads, &cal_gibps);
  (void)cal_gibps;
  const auto t_pipe = Clock::now();
  stats.codec = choice.name;
  stats.model = choice.model;
  if (opt.log) opt.log("codec " + choice.name + ": " + choice.model);

  const std::string fin = dir + "/" + rank_file(opt.rank);
  tz::container::TensorWriterOptions wo = writer_options(opt, choice, threads);
  wo.ref = ref.rank_path;
  RankFileFacts facts;
  const tz::container::TensorWriterStats ws = write_tensors(fin, wo, segs, &facts.tensors);
  record_stats(opt, choice, threads, data_size, t_pipe, ws, stats);
  facts.rank = opt.rank;
  facts.file_size = ws.file_bytes;
  facts.file_xxh64 = ws.file_xxh64;
  facts.chunk_bytes = chunk;
  facts.codec = choice.name;
  facts.time_model = choice.model;
  facts.metadata = opt.metadata;
  if (ws.deltas) {
    // The references the rank file records (the previous rank file).
    try {
      facts.references = tz::container::Reader(fin, 1).references();
    } catch (const tz::container::Error& e) {
      rethrow_container(e);
    }
    facts.depends_on = ref.depends_on;
  }
  json out = rank_entry_json(facts);
  // What restore will accept, checked before anything points at it.
  try {
    parse_rank_entry(out, opt.rank, fin + " (its manifest entry)");
  } catch (const Error& e) {
    fail(ErrorKind::kInternal, std::string("the engine made a manifest entry it cannot read: ") + e.what());
  }
  return out;
}

SaveStats save_rank(const std::string& dir, std::span<const TensorView> tensors, const SaveOptions& opt) {
  const auto t0 = Clock::now();
  if (opt.world_size < 1 || opt.rank < 0 || opt.rank >= opt.world_size)
    fail(ErrorKind::kUsage, "rank must be in [0, world_size)");
  ensure_dir(dir);
  {
    struct stat st {};
    if (::stat((dir + "/" + kManifest).c_str(), &st) == 0)
      fail(ErrorKind::kUsage, dir + ": already holds a complete checkpoint (save into a new directory)");
  }
  // The checkpoint's directory entry must be durable in its parent too.
  fsync_path(parent_of(dir), true);
  SaveStats stats;
  json rank = write_rank_file(dir, tensors, opt, stats);
  if (opt.world_size == 1) {
    const json body = manifest_body(1, opt.metadata, json::array({rank}), dir);
    write_atomic(dir, kManifest, manifest_text(body));
  } else {
    write_atomic(dir, rank_index(opt.rank), rank.dump());
  }
  stats.seconds = secs(t0, Clock::now());
  stats.stall_seconds = stats.seconds;
  return stats;
}

void commit_manifest(const std::string& dir, int world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize) fail(ErrorKind::kUsage, "world_size out of range");
  json ranks = json::array();
  json meta = json::object();
  for (int r = 0; r < world_size; ++r) {
    // Each rank's index, validated as restore will (a rank file that is not
    // what its index says is refused by restore; its size is checked here).
    const std::string p = dir + "/" + rank_index(r);
    json j = parse_json_text(read_bounded(p, kMaxManifestBytes, ErrorKind::kIncomplete), p, "rank index");
    const ManifestRank mr = parse_rank_entry(j, r, p);
    struct stat st {};
    const std::string rf = dir + "/" + mr.file;
    if (::stat(rf.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != mr.file_size)
      fail(ErrorKind::kIncomplete, rf + ": missing or not the size its index records");
    if (r == 0 && j.contains("metadata")) meta = j["metadata"];
    ranks.push_back(std::move(j));
  }
  const json body = manifest_body(world_size, meta, ranks, dir);
  const std::string text = manifest_text(body);
  parse_manifest(text, dir + "/" + kManifest);  // what restore will accept (names unique across ranks, ...)
  write_atomic(dir, kManifest, text);
}

}  // namespace

SaveStats save(const std::string& dir, std::span<const TensorView> tensors, const SaveOptions& opt) {
  return resource_errors_as_error(dir, [&] { return save_rank(dir, tensors, opt); });
}

void commit(const std::string& dir, int world_size) {
  resource_errors_as_error(dir, [&] { commit_manifest(dir, world_size); });
}

}  // namespace tz::checkpoint

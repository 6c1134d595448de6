// Restore (doc/checkpoint.md, "Restore"): Checkpoint opens a checkpoint from
// its validated manifest (manifest.cpp), checks each rank file's size by
// fstat, and before the first read of a rank file checks that file's own
// index, as the container Reader validates it, against the manifest: one
// validator for .tzip files, whoever reads them. Loads then read the frames
// through the read-ahead ring (restore_ring.cpp) and decode them here,
// undoing cast and delta predictions.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "checkpoint_internal.hpp"
#include "codec/predict.h"
#include "container/internal.hpp"  // codec dtype names
#include "manifest.hpp"
#include "references.hpp"
#include "restore_ring.hpp"
#include "tensorzip/tensorzip.h"

#ifdef TZ_CHECKPOINT_CUDA
#include <cuda_runtime_api.h>

#include "checkpoint_gpu.hpp"
#endif

namespace tz::checkpoint {

using namespace detail;
using tz::container::PredictKind;

namespace {
struct RTensor {
  TensorInfo info;
  size_t file = 0;                     // index into Impl::files (= rank entry)
  const ManifestTensor* mt = nullptr;  // in Impl::manifest
  // Cast prediction: frames hold value XOR cast(source), the source an FP32
  // tensor of the same shape in the same rank file; -1: none.
  int cast_kind = -1;
  // Delta prediction: frames hold value XOR the tensor `delta_index` of the
  // reference reader `delta_ref` (Impl::refs); -1: none.
  int delta_ref = -1;
  size_t delta_index = 0;
};

// A frame to decode, with what it needs.
struct Job {
  const RTensor* t;
  const ManifestFrame* f;
  const LoadRequest* req;
  const uint8_t* cast_src;        // FP32 source bytes of a cast tensor
  tz::container::Reader* dref;    // reference of a delta tensor
};

// Per decode worker: codec context and scratch buffers, kept across frames.
struct DecodeState {
  std::unique_ptr<tz_ctx, void (*)(tz_ctx*)> ctx{nullptr, &tz_ctx_free};
  std::vector<uint8_t> host, pred;
};

std::string frame_label(const RTensor& t, const ManifestFrame& f, const std::string& file) {
  return "tensor '" + t.info.name + "' (" + file + ", frame at offset " + std::to_string(f.offset) + ")";
}

// The codec's error for a frame: allocation failure is the machine's, any
// other is damage.
[[noreturn]] void decode_failed(const std::string& what, size_t r) {
  if (!tz_is_error(r)) fail(ErrorKind::kCorrupt, what + ": wrong decoded size");
  const std::string msg = what + ": " + tz_get_error_name(r) + ": " + tz_last_error_detail();
  fail(tz_get_error_code(r) == TZ_ERROR_ALLOCATION ? ErrorKind::kInternal : ErrorKind::kCorrupt, msg);
}
}  // namespace

struct Checkpoint::Impl {
  std::string dir;
  unsigned threads;
  tz::io::Backend io = tz::io::Backend::kAuto;
  std::string io_name = "none";  // read back end of the last load
  tz::io::GdsDecision gds;       // Io::kGds: cuFile for device destinations
  Manifest manifest;
  std::vector<std::string> files;  // rank files, by rank
  std::vector<int> fds;
  std::vector<int> dfds;  // O_DIRECT descriptors (-1: not requested or refused)
  std::atomic<bool> direct_ok{true};
  std::vector<TensorInfo> infos;
  std::vector<RTensor> tensors;
  std::map<std::string, size_t> by_name;
  std::map<std::string, std::string> meta;
  // References of delta tensors (the previous checkpoint's rank files),
  // opened and checked by the constructor.
  std::vector<std::unique_ptr<tz::container::Reader>> refs;
  // Rank files whose container index was checked against the manifest.
  std::mutex check_mu;
  std::vector<bool> checked;
  ~Impl() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    for (int fd : dfds)
      if (fd >= 0) ::close(fd);
  }

  void open_rank_file(size_t i, bool direct_io);
  void check_rank_file(size_t i);
  void decode(const Job& jb, const uint8_t* frame, DecodeState& st) const;
};

// Opens rank file i: a regular file of exactly the size the manifest records.
void Checkpoint::Impl::open_rank_file(size_t i, bool direct_io) {
  const std::string& p = files[i];
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) fail(ErrorKind::kCorrupt, p + ": missing (the manifest lists it)");
    fail_errno(p, "open", e);
  }
  fds[i] = fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno(p, "stat", errno);
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::kCorrupt, p + ": not a regular file");
  const uint64_t want = manifest.ranks[i].file_size;
  if ((uint64_t)st.st_size != want)
    fail(ErrorKind::kCorrupt, p + ": " + std::to_string((uint64_t)st.st_size) + " bytes, the manifest records " +
                                  std::to_string(want) + " (truncated or replaced)");
  if (!direct_io) return;
  const int dfd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK | O_NOCTTY);
  struct stat dst {};
  if (dfd >= 0 && (::fstat(dfd, &dst) != 0 || dst.st_dev != st.st_dev || dst.st_ino != st.st_ino)) {
    ::close(dfd);  // another file by now: no direct reads of it
    return;
  }
  dfds[i] = dfd;
}

// The rank file's index as the container Reader validates it (header
// checksum, frames tiling the file, sizes from dtype x shape, predictions)
// must say what the manifest says, field by field.
void Checkpoint::Impl::check_rank_file(size_t i) {
  std::lock_guard<std::mutex> lk(check_mu);
  if (checked[i]) return;
  const ManifestRank& r = manifest.ranks[i];
  const std::string& p = files[i];
  std::unique_ptr<tz::container::Reader> rd;
  try {
    rd = std::make_unique<tz::container::Reader>(p, 1);
  } catch (const tz::container::Error& e) {
    fail(e.kind() == tz::container::ErrorKind::kIO ? ErrorKind::kIO : ErrorKind::kCorrupt, e.what());
  }
  auto bad = [&](const std::string& m) {
    fail(ErrorKind::kCorrupt, p + ": does not match " + dir + "/" + kManifest + ": " + m);
  };
  if (rd->file_size() != r.file_size)
    bad(std::to_string(rd->file_size()) + " bytes, the manifest records " + std::to_string(r.file_size));
  if (rd->file_checksum() != r.file_xxh64)
    bad("file checksum " + hex64(rd->file_checksum()) + ", the manifest records " + hex64(r.file_xxh64));
  if (rd->chunk_bytes() != r.chunk_bytes) bad("chunk_bytes differ");
  const auto& xs = rd->references();
  if (xs.size() != r.references.size()) bad("references differ");
  for (size_t k = 0; k < xs.size(); ++k)
    if (xs[k].file != r.references[k].file || xs[k].xxh64 != r.references[k].xxh64 ||
        xs[k].has_header_xxh64 != r.references[k].has_header_xxh64 ||
        (xs[k].has_header_xxh64 && xs[k].header_xxh64 != r.references[k].header_xxh64))
      bad("references differ");
  if (rd->tensors().size() != r.tensors.size())
    bad(std::to_string(rd->tensors().size()) + " tensors, the manifest lists " + std::to_string(r.tensors.size()));
  for (const auto& mt : r.tensors) {
    const long k = rd->find(mt.name);
    if (k < 0) bad("no tensor '" + mt.name + "'");
    const tz::container::TensorEntry& e = rd->tensors()[(size_t)k];
    const std::string t = "tensor '" + mt.name + "': ";
    if (e.dtype != mt.dtype || e.shape != mt.shape || e.raw_size() != mt.size) bad(t + "dtype, shape or size differ");
    if ((!mt.codec_dtype.empty() && mt.codec_dtype != tz::container::detail::codec_dtype_name(e.codec_dtype)) ||
        (mt.has_level && mt.level != e.level))
      bad(t + "codec differs");
    if (e.frames.size() != mt.frames.size()) bad(t + "frames differ");
    for (size_t f = 0; f < e.frames.size(); ++f) {
      const auto& a = e.frames[f];
      const auto& b = mt.frames[f];
      if (a.offset != b.offset || a.size != b.size || a.raw_size != b.raw_size || a.xxh64 != b.xxh64)
        bad(t + "frame " + std::to_string(f) + " differs");
    }
    const bool same_prediction =
        e.predict.kind == mt.predict &&
        (mt.predict != PredictKind::kCast || (e.predict.ref < 0 && e.predict.source == mt.cast_source)) &&
        (mt.predict != PredictKind::kDelta || e.predict.ref == mt.delta_ref);
    if (!same_prediction) bad(t + "prediction differs");
  }
  checked[i] = true;
}

Checkpoint::Checkpoint(const std::string& dir, unsigned threads, bool direct_io, Io io)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.dir = dir;
  m.io = io == Io::kPosix ? tz::io::Backend::kPosix : io == Io::kUring ? tz::io::Backend::kUring : tz::io::Backend::kAuto;
  m.gds = gds_decision(io);
  // TZ_TEST_REFUSE_O_DIRECT=1: behave as on a file system refusing O_DIRECT.
  if (const char* r = std::getenv("TZ_TEST_REFUSE_O_DIRECT"); r && *r == '1') direct_io = false;
  m.threads = resolve_threads(threads);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) fail(ErrorKind::kNotFound, dir + ": no such checkpoint");
  resource_errors_as_error(dir, [&] {
    m.manifest = read_manifest(dir);
    m.meta = m.manifest.metadata;
    for (const auto& r : m.manifest.ranks) {
      m.files.push_back(dir + "/" + r.file);
      // This rank file's references: opened and checked now, so that a
      // missing or changed previous checkpoint fails here, naming both.
      const size_t ref_base = m.refs.size();
      for (auto& rd : open_rank_references(dir, r, m.manifest.depends_on)) m.refs.push_back(std::move(rd));
      for (const auto& mt : r.tensors) {
        RTensor rt;
        rt.info.name = mt.name;
        rt.info.dtype = mt.dtype;
        rt.info.shape = mt.shape;
        rt.info.size = mt.size;
        rt.info.rank = r.rank;
        for (const auto& f : mt.frames) rt.info.compressed_size += f.size;
        rt.file = m.files.size() - 1;
        rt.mt = &mt;
        if (mt.predict == PredictKind::kCast) {
          rt.cast_kind = mt.dtype == "F16" ? tz::predict::kCastF16 : tz::predict::kCastBF16;
        } else if (mt.predict == PredictKind::kDelta) {
          rt.delta_ref = (int)(ref_base + (size_t)mt.delta_ref);
          tz::container::Reader& rd = *m.refs[(size_t)rt.delta_ref];
          const long ri = rd.find(mt.name);
          if (ri < 0 || rd.tensors()[(size_t)ri].dtype != mt.dtype || rd.tensors()[(size_t)ri].shape != mt.shape)
            fail(ErrorKind::kCorrupt, dir + "/" + kManifest + ": tensor '" + mt.name +
                                          "': no tensor of the same dtype and shape in " + rd.path());
          rt.delta_index = (size_t)ri;
        }
        m.by_name.emplace(mt.name, m.tensors.size());  // names are unique (parse_manifest)
        m.infos.push_back(rt.info);
        m.tensors.push_back(std::move(rt));
      }
    }
    m.fds.assign(m.files.size(), -1);
    m.dfds.assign(m.files.size(), -1);
    m.checked.assign(m.files.size(), false);
    for (size_t i = 0; i < m.files.size(); ++i) m.open_rank_file(i, direct_io);
  });
}

Checkpoint::~Checkpoint() = default;
std::string Checkpoint::io() const {
  const auto& m = *impl_;
  if (!m.gds.use && !m.gds.reason.empty()) return m.io_name + " (cuFile not used: " + m.gds.reason + ")";
  return m.io_name;
}
bool Checkpoint::direct_io() const {
  bool d = impl_->direct_ok && !impl_->dfds.empty();
  for (int fd : impl_->dfds) d = d && fd >= 0;
  return d;
}
const std::vector<TensorInfo>& Checkpoint::tensors() const { return impl_->infos; }
const std::map<std::string, std::string>& Checkpoint::metadata() const { return impl_->meta; }
long Checkpoint::find(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? -1 : (long)it->second;
}

void Checkpoint::load(std::span<const LoadRequest> requests) {
  auto& m = *impl_;
  resource_errors_as_error(m.dir, [&] {
    // Phase 1: plain tensors and the FP32 sources of requested cast tensors
    // (into the caller's buffer when it asked for the source in host memory,
    // else into a temporary, at most twice the cast tensor's size the caller
    // provided room for); phase 2: the cast tensors, residual XOR cast.
    std::vector<LoadRequest> first;
    std::vector<const LoadRequest*> second;
    std::map<size_t, const uint8_t*> src_bytes;
    std::vector<std::unique_ptr<uint8_t[]>> temps;
    first.reserve(requests.size() * 2);
    for (const auto& r : requests) {
      const long i = find(r.name);
      if (i < 0) fail(ErrorKind::kNotFound, m.dir + ": no tensor '" + r.name + "'");
      const RTensor& t = m.tensors[(size_t)i];
      if (r.capacity < t.info.size)
        fail(ErrorKind::kUsage, "tensor '" + r.name + "': destination holds " + std::to_string(r.capacity) +
                                    " bytes, needs " + std::to_string(t.info.size));
      if (t.info.size && !r.dst) fail(ErrorKind::kUsage, "tensor '" + r.name + "': null destination");
#ifndef TZ_CHECKPOINT_CUDA
      if (r.memory == Memory::kDevice) fail(ErrorKind::kUsage, "device destinations need a CUDA build");
#endif
      m.check_rank_file(t.file);
      if (t.cast_kind < 0) {
        first.push_back(r);
        if (r.memory == Memory::kHost) src_bytes.emplace((size_t)i, static_cast<const uint8_t*>(r.dst));
      } else {
        second.push_back(&r);
      }
    }
    for (const LoadRequest* r : second) {
      const size_t s = m.by_name.at(m.tensors[(size_t)find(r->name)].mt->cast_source);
      if (src_bytes.count(s)) continue;
      const uint64_t n = m.tensors[s].info.size;
      temps.emplace_back(new uint8_t[n ? n : 1]);
      first.push_back({m.tensors[s].info.name, temps.back().get(), n, Memory::kHost});
      src_bytes[s] = temps.back().get();
    }
    run_load(first, src_bytes);
    std::vector<LoadRequest> casts;
    for (const LoadRequest* r : second) casts.push_back(*r);
    run_load(casts, src_bytes);
  });
}

// Decodes one frame (already read, xxh64 not yet checked) into its
// destination, undoing its prediction.
void Checkpoint::Impl::decode(const Job& jb, const uint8_t* frame, DecodeState& st) const {
  const ManifestFrame& f = *jb.f;
  const std::string what = frame_label(*jb.t, f, files[jb.t->file]);
  if (XXH64(frame, f.size, 0) != f.xxh64) fail(ErrorKind::kCorrupt, what + ": checksum mismatch");
  if (!st.ctx) {
    st.ctx.reset(tz_ctx_create(1));
    if (!st.ctx) fail(ErrorKind::kInternal, what + ": cannot create a codec context (out of memory)");
  }
  uint8_t* dst = static_cast<uint8_t*>(jb.req->dst) + f.raw_off;
  if (!jb.cast_src && !jb.dref) {
    const size_t r = tz_ctx_decompress(st.ctx.get(), dst, f.raw_size, frame, f.size);
    if (tz_is_error(r) || r != f.raw_size) decode_failed(what, r);
    return;
  }
  // Predicted: decode the residual on the CPU (an empty frame is an
  // all-zero residual), then XOR the cast of the FP32 source, or the
  // reference's bytes of this frame (delta).
  uint8_t* out = dst;
  const bool to_dev = jb.req->memory == Memory::kDevice;
  if (to_dev) {
    if (st.host.size() < f.raw_size) st.host.resize(f.raw_size);
    out = st.host.data();
  }
  if (f.size == 0) {
    std::memset(out, 0, f.raw_size);
  } else {
    const size_t r = tz_ctx_decompress(st.ctx.get(), out, f.raw_size, frame, f.size);
    if (tz_is_error(r) || r != f.raw_size) decode_failed(what, r);
  }
  if (jb.cast_src) {
    // The source holds 2 x the cast tensor's bytes (FP32, same shape: checked by parse_rank_entry).
    tz::predict::cast_xor(jb.cast_src + f.raw_off * 2, out, f.raw_size / 2, jb.t->cast_kind);
  } else {
    if (st.pred.size() < f.raw_size) st.pred.resize(f.raw_size);
    try {
      jb.dref->read_range(jb.t->delta_index, f.raw_off, f.raw_size, st.pred.data());
    } catch (const tz::container::Error& e) {
      fail(ErrorKind::kCorrupt, what + ": reference " + jb.dref->path() + ": " + e.what());
    }
    tz::predict::xor_bytes(st.pred.data(), out, f.raw_size);
  }
#ifdef TZ_CHECKPOINT_CUDA
  if (to_dev && cudaMemcpy(dst, out, f.raw_size, cudaMemcpyHostToDevice) != cudaSuccess)
    fail(ErrorKind::kInternal, what + ": cudaMemcpy failed");
#endif
}

void Checkpoint::run_load(std::span<const LoadRequest> requests, const std::map<size_t, const uint8_t*>& src_bytes) {
  auto& m = *impl_;
  std::vector<Job> jobs;
  for (const auto& r : requests) {
    const RTensor& t = m.tensors[(size_t)find(r.name)];
    const uint8_t* cs = t.cast_kind >= 0 ? src_bytes.at(m.by_name.at(t.mt->cast_source)) : nullptr;
    tz::container::Reader* dr = t.delta_ref >= 0 ? m.refs[(size_t)t.delta_ref].get() : nullptr;
    for (const auto& f : t.mt->frames) jobs.push_back({&t, &f, &r, cs, dr});
  }
#ifdef TZ_CHECKPOINT_CUDA
  {
    // Device destinations (not cast-predicted): read in batches (cuFile
    // straight into device memory with Io::kGds, else through pinned
    // buffers) and decoded on the GPU in batches.
    std::vector<gpu::DevFrame> dev;
    std::vector<Job> rest;
    for (const auto& j : jobs) {
      if (j.req->memory != Memory::kDevice || j.cast_src || j.dref) {
        rest.push_back(j);
        continue;
      }
      gpu::DevFrame f;
      f.fd = m.fds[j.t->file];
      f.dfd = m.dfds[j.t->file];
      f.offset = j.f->offset;
      f.size = j.f->size;
      f.xxh64 = j.f->xxh64;
      f.dst = static_cast<uint8_t*>(j.req->dst) + j.f->raw_off;
      f.raw_size = j.f->raw_size;
      f.what = frame_label(*j.t, *j.f, m.files[j.t->file]);
      dev.push_back(std::move(f));
    }
    if (!dev.empty()) {
      std::string note;
      for (bool use_gds = m.gds.use;; use_gds = false) {
        try {
          gpu::load_frames(dev, use_gds);
          m.io_name = use_gds ? "cuFile" : "pread+pinned" + note;
          break;
        } catch (const std::runtime_error& e) {
          const std::string w = e.what();
          if (w.rfind("corrupt: ", 0) == 0) fail(ErrorKind::kCorrupt, w.substr(9));
          // cuFile refused this file (registration or a read): POSIX reads,
          // as KvikIO's compatibility mode does. The destinations are simply
          // written again.
          if (!use_gds) fail(ErrorKind::kIO, w);
          note = " (cuFile failed: " + w + ")";
        }
      }
    }
    jobs.swap(rest);
  }
#endif
  if (jobs.empty()) return;
  std::vector<FrameRead> reads(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i)
    reads[i] = {m.fds[jobs[i].t->file], m.dfds[jobs[i].t->file], jobs[i].f->offset, jobs[i].f->size};
  std::vector<DecodeState> states(std::max(1u, m.threads));
  read_frames_ahead(
      reads, m.threads, m.io, m.direct_ok, &m.io_name,
      [&](size_t j) { return frame_label(*jobs[j].t, *jobs[j].f, m.files[jobs[j].t->file]); },
      [&](size_t j, const uint8_t* frame, unsigned w) { m.decode(jobs[j], frame, states[w]); });
}

std::vector<uint8_t> Checkpoint::read(const std::string& name) {
  const long i = find(name);
  if (i < 0) fail(ErrorKind::kNotFound, impl_->dir + ": no tensor '" + name + "'");
  impl_->check_rank_file(impl_->tensors[(size_t)i].file);  // its size is then the rank file's, not only the manifest's
  std::vector<uint8_t> out;
  resource_errors_as_error("tensor '" + name + "'", [&] { out.resize(impl_->infos[(size_t)i].size); });
  LoadRequest r{name, out.data(), out.size(), Memory::kHost};
  load(std::span<const LoadRequest>(&r, 1));
  return out;
}

std::vector<std::string> Checkpoint::verify() {
  std::vector<std::string> bad;
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < impl_->infos.size(); ++i) {
    const TensorInfo& t = impl_->infos[i];
    try {
      impl_->check_rank_file(impl_->tensors[i].file);  // before the buffer is sized from it
      resource_errors_as_error("tensor '" + t.name + "'", [&] { buf.resize(t.size); });
      LoadRequest r{t.name, buf.data(), buf.size(), Memory::kHost};
      load(std::span<const LoadRequest>(&r, 1));
    } catch (const Error& e) {
      bad.push_back(t.name + ": " + e.what());
    }
  }
  return bad;
}

}  // namespace tz::checkpoint

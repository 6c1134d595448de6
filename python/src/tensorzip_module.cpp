// tensorzip._tensorzip: the nanobind layer under the `tensorzip` Python
// package. It only moves bytes: the package (python/tensorzip) decides dtypes,
// shapes and file layouts. Every function takes or fills objects that export
// the buffer protocol (bytes, bytearray, memoryview, NumPy arrays, torch CPU
// tensors seen through .numpy()), so no tensor data is copied on the way in
// or out, and the GIL is released while coding or doing file I/O.
//
// Errors: codec calls raise tensorzip.TensorZipError (or CorruptDataError)
// carrying tz_get_error_name() and tz_last_error_detail(); container calls
// map tz::container::Error kinds onto exception classes created here.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "codec/policy.h"  // policy_option_error: the encoder options' rules
#include "tensorzip/tensorzip.h"
#ifdef TZ_PY_HAVE_CONTAINER
#include "tensorzip/container.hpp"
#endif
#ifdef TZ_PY_HAVE_IO
#include "queue_sink.hpp"
#endif
#ifdef TZ_PY_HAVE_CUDA
#include "checkpoint_gpu.hpp"  // tz::checkpoint::gpu::WriterEncoder (src/checkpoint)
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Exception classes (created in module init, owned by the module).
PyObject* g_error = nullptr;          // TensorZipError(Exception)
PyObject* g_corrupt = nullptr;        // CorruptDataError(TensorZipError, ValueError)
PyObject* g_usage = nullptr;          // UsageError(TensorZipError, ValueError)
PyObject* g_io = nullptr;             // TensorZipIOError(TensorZipError, OSError)
PyObject* g_exists = nullptr;         // TensorZipExistsError(TensorZipError, FileExistsError)
PyObject* g_not_found = nullptr;      // TensorZipFileNotFoundError(TensorZipIOError, FileNotFoundError)
PyObject* g_permission = nullptr;     // TensorZipPermissionError(TensorZipIOError, PermissionError)

// A C++ exception that becomes a given Python exception class. OS errors
// (OSError subclasses) also carry errno and the file name, set as the
// exception's errno / strerror / filename attributes.
struct PyErrorOf : std::runtime_error {
  PyObject* type;
  int sys_errno = 0;
  std::string filename;
  PyErrorOf(PyObject* t, const std::string& msg) : std::runtime_error(msg), type(t) {}
  PyErrorOf(PyObject* t, const std::string& msg, int err, std::string file)
      : std::runtime_error(msg), type(t), sys_errno(err), filename(std::move(file)) {}
};

// Throws for a codec error code; call with the GIL held or not (no Python API).
[[noreturn]] void throw_codec(size_t code, const char* what) {
  const tz_error_code ec = tz_get_error_code(code);
  std::string msg = std::string(what) + ": " + tz_get_error_name(code);
  const char* detail = tz_last_error_detail();
  if (detail && *detail) msg += std::string(" (") + detail + ")";
  PyObject* type = g_error;
  switch (ec) {
    case TZ_ERROR_SRC_TRUNCATED:
    case TZ_ERROR_BAD_MAGIC:
    case TZ_ERROR_BAD_VERSION:
    case TZ_ERROR_CORRUPT_HEADER:
    case TZ_ERROR_CORRUPT_BLOCK:
    case TZ_ERROR_CHECKSUM:
      type = g_corrupt;
      break;
    case TZ_ERROR_BAD_PARAMETER:
      type = g_usage;
      break;
    default:
      break;
  }
  throw PyErrorOf(type, msg);
}

// RAII view of an object's buffer (C-contiguous; writable when asked).
class BufferView {
 public:
  BufferView(nb::handle obj, bool writable, const char* name) {
    const int flags = writable ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) : PyBUF_C_CONTIGUOUS;
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
      PyErr_Clear();
      throw PyErrorOf(PyExc_TypeError, std::string(name) + " must be a C-contiguous " +
                                           (writable ? "writable " : "") +
                                           "object with the buffer protocol (bytes, bytearray, memoryview, "
                                           "numpy array)");
    }
    held_ = true;
  }
  ~BufferView() {
    if (held_) PyBuffer_Release(&view_);
  }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  uint8_t* wdata() { return static_cast<uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// Contexts (thread pool + scratch) reused across calls, per thread count:
// many small tensors must not pay thread start-up each time. A context is
// taken out of the pool for the duration of one call, so concurrent Python
// threads never share one.
class CtxPool {
 public:
  struct Lease {
    CtxPool* pool;
    unsigned threads;
    tz_ctx* ctx;
    ~Lease() { pool->give_back(threads, ctx); }
  };
  Lease take(unsigned threads) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& v = free_[threads];
      if (!v.empty()) {
        tz_ctx* c = v.back();
        v.pop_back();
        return Lease{this, threads, c};
      }
    }
    tz_ctx* c = tz_ctx_create(threads);
    if (!c) throw PyErrorOf(PyExc_MemoryError, "tensorzip: cannot create a coding context");
    return Lease{this, threads, c};
  }
  void give_back(unsigned threads, tz_ctx* c) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& v = free_[threads];
    if (v.size() < 4)
      v.push_back(c);
    else
      tz_ctx_free(c);
  }

 private:
  std::mutex mu_;
  std::map<unsigned, std::vector<tz_ctx*>> free_;
};

CtxPool& ctx_pool() {
  static CtxPool* pool = new CtxPool();  // never destroyed: contexts may outlive interpreter teardown order
  return *pool;
}

tz_params make_params(int dtype, int level, unsigned block_elems) {
  if (dtype < TZ_DTYPE_BYTES || dtype > TZ_DTYPE_F8_E5M2)
    throw PyErrorOf(g_usage, "unknown codec dtype " + std::to_string(dtype));
  if (const char* e = tz::policy_option_error(level, block_elems)) throw PyErrorOf(g_usage, e);
  tz_params p{};
  p.dtype = static_cast<tz_dtype>(dtype);
  p.level = level;
  p.block_elems = block_elems;
  return p;
}

// prefix + one codec frame of `data`, as a new bytes object.
nb::bytes compress(nb::handle prefix_obj, nb::handle data_obj, int dtype, int level, unsigned block_elems,
                   unsigned threads) {
  const tz_params params = make_params(dtype, level, block_elems);
  BufferView prefix(prefix_obj, false, "prefix");
  BufferView data(data_obj, false, "data");
  const size_t bound = tz_compress_bound(data.size());
  if (bound > static_cast<size_t>(PY_SSIZE_T_MAX) - prefix.size())
    throw PyErrorOf(g_usage, "tensor too large");
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(prefix.size() + bound));
  if (!out) throw nb::python_error();
  nb::object owner = nb::steal(out);
  char* dst = PyBytes_AS_STRING(out);
  std::memcpy(dst, prefix.data(), prefix.size());
  size_t r;
  {
    nb::gil_scoped_release nogil;
    auto lease = ctx_pool().take(threads);
    r = tz_ctx_compress(lease.ctx, dst + prefix.size(), bound, data.data(), data.size(), &params);
  }
  if (tz_is_error(r)) throw_codec(r, "compression failed");
  PyObject* tmp = owner.release().ptr();
  if (_PyBytes_Resize(&tmp, static_cast<Py_ssize_t>(prefix.size() + r)) != 0) throw nb::python_error();
  return nb::steal<nb::bytes>(tmp);
}

// Decodes the frame src[offset:] (it must end the buffer) into dst, which must
// have exactly the frame's raw size. Returns the number of bytes written.
size_t decompress_into(nb::handle src_obj, size_t offset, nb::handle dst_obj, unsigned threads) {
  BufferView src(src_obj, false, "data");
  BufferView dst(dst_obj, true, "out");
  if (offset > src.size()) throw PyErrorOf(g_corrupt, "truncated input: frame offset past the end");
  size_t r;
  {
    nb::gil_scoped_release nogil;
    auto lease = ctx_pool().take(threads);
    r = tz_ctx_decompress(lease.ctx, dst.wdata(), dst.size(), src.data() + offset, src.size() - offset);
  }
  if (tz_is_error(r)) throw_codec(r, "decompression failed");
  if (r != dst.size())
    throw PyErrorOf(g_corrupt, "decompression failed: frame holds " + std::to_string(r) +
                                   " bytes but the tensor needs " + std::to_string(dst.size()));
  return r;
}

nb::dict frame_info(nb::handle src_obj, size_t offset) {
  BufferView src(src_obj, false, "data");
  if (offset > src.size()) throw PyErrorOf(g_corrupt, "truncated input: frame offset past the end");
  tz_frame_info info{};
  const size_t r = tz_frame_inspect(src.data() + offset, src.size() - offset, &info);
  if (tz_is_error(r)) throw_codec(r, "invalid frame");
  nb::dict d;
  d["format_version"] = info.format_version;
  d["dtype"] = static_cast<int>(info.dtype);
  d["dtype_name"] = tz_dtype_name(info.dtype);
  d["n_streams"] = info.n_streams;
  d["block_elems"] = info.block_elems;
  d["n_blocks"] = info.n_blocks;
  d["raw_size"] = info.raw_size;
  d["prefix_size"] = info.prefix_size;
  d["frame_size"] = info.frame_size;
  return d;
}

// Byte range of codec blocks [first, first+count) of a frame, from its prefix
// (header + tables + block index, tz_frame_prefix_size bytes):
// (offset, size) of their compressed bytes relative to the frame start and
// (raw_offset, raw_size) of their decoded bytes. Lets a reader fetch only the
// blocks that cover a byte range of a tensor (tensorzip.dcp partial reads).
nb::tuple frame_block_range(nb::handle prefix_obj, unsigned first, unsigned count) {
  BufferView prefix(prefix_obj, false, "prefix");
  uint64_t off = 0, size = 0, raw_off = 0, raw_size = 0;
  const size_t r = tz_frame_block_range(prefix.data(), prefix.size(), first, count, &off, &size, &raw_off, &raw_size);
  if (tz_is_error(r)) throw_codec(r, "invalid block range");
  return nb::make_tuple(off, size, raw_off, raw_size);
}

// Decodes blocks [first, first+count) of a frame (given its prefix and the
// compressed bytes of exactly those blocks) into out[out_offset:], checking
// each block's checksum. Returns the number of bytes written.
size_t decompress_blocks_into(nb::handle prefix_obj, nb::handle blocks_obj, unsigned first, unsigned count,
                              nb::handle dst_obj, size_t out_offset, unsigned threads) {
  BufferView prefix(prefix_obj, false, "prefix");
  BufferView blocks(blocks_obj, false, "blocks");
  BufferView dst(dst_obj, true, "out");
  if (out_offset > dst.size()) throw PyErrorOf(g_usage, "out_offset past the end of out");
  size_t r;
  unsigned bad = 0;
  {
    nb::gil_scoped_release nogil;
    auto lease = ctx_pool().take(threads);
    r = tz_ctx_decompress_blocks_ex(lease.ctx, dst.wdata() + out_offset, dst.size() - out_offset, prefix.data(),
                                    prefix.size(), blocks.data(), blocks.size(), first, count, &bad);
  }
  if (tz_is_error(r)) throw_codec(r, ("decoding block " + std::to_string(bad) + " failed").c_str());
  return r;
}

#ifdef TZ_PY_HAVE_CONTAINER
namespace tc = tz::container;

// The container's messages are shared with the tzip CLI; in Python, its
// command-line advice is given in the Python API's terms.
std::string python_terms(std::string msg) {
  static const std::pair<const char*, const char*> kTerms[] = {
      {"give its location (tzip --ref, Python refs=)", "give its location with refs="},
      {"given explicitly (tzip --ref, Python refs=)", "given explicitly (refs=)"},
      {"(--ref-original pairs with --ref)", "(ref_original pairs with ref)"},
      {"ref_original (--ref-original) needs a previous checkpoint (--ref)", "ref_original needs ref"},
      {"a previous checkpoint (--ref) needs prediction (drop --no-predict)", "ref needs predict=True"},
  };
  for (const auto& [cli, py] : kTerms)
    for (size_t p = msg.find(cli); p != std::string::npos; p = msg.find(cli, p + std::strlen(py)))
      msg.replace(p, std::strlen(cli), py);
  return msg;
}

// `files`: the paths a call works on; an OS error names the one its message starts with.
[[noreturn]] void rethrow_container(const tc::Error& e, std::initializer_list<const std::string*> files = {}) {
  PyObject* type = g_error;
  switch (e.kind()) {
    case tc::ErrorKind::kUsage: type = g_usage; break;
    case tc::ErrorKind::kBadInput: type = g_corrupt; break;
    case tc::ErrorKind::kIO: type = g_io; break;
    case tc::ErrorKind::kExists: type = g_exists; break;
    case tc::ErrorKind::kInternal: type = g_error; break;
    case tc::ErrorKind::kInterrupted: type = g_error; break;
  }
  std::string msg = python_terms(e.what());
  // An existing output says how to replace it, in the Python API's terms
  // (the tzip CLI adds its own advice to the same message).
  const std::string exists = ": already exists";
  if (e.kind() == tc::ErrorKind::kExists && msg.size() >= exists.size() &&
      msg.compare(msg.size() - exists.size(), exists.size(), exists) == 0)
    msg += " (pass overwrite=True to replace it)";
  if (e.kind() != tc::ErrorKind::kIO && e.kind() != tc::ErrorKind::kExists) throw PyErrorOf(type, msg);
  const int err = e.kind() == tc::ErrorKind::kExists ? EEXIST : e.sys_errno();
  if (err == ENOENT) type = g_not_found;
  if (err == EACCES || err == EPERM) type = g_permission;
  std::string file;
  for (const std::string* f : files)
    if (f && !f->empty() && f->size() > file.size() && msg.compare(0, f->size() + 1, *f + ":") == 0) file = *f;
  throw PyErrorOf(type, msg, err, file);
}

template <class F>
auto guarded(F&& f, std::initializer_list<const std::string*> files = {}) -> decltype(f()) {
  try {
    return f();
  } catch (const tc::Error& e) {
    rethrow_container(e, files);
  }
}

// predict: cast prediction (BF16/F16 from an FP32 tensor of the same file);
// ref: previous checkpoint's .tzip (delta), "" for none; ref_original: the
// verified safetensors export of ref (predictor bytes read from it instead
// of decoding ref), "" for none; min_gain < 0: the library default.
nb::tuple container_compress_file(const std::string& in, const std::string& out, int level, unsigned block_elems,
                                  unsigned threads, uint64_t chunk_bytes, bool force, bool predict,
                                  const std::string& ref, const std::string& ref_original, double min_gain,
                                  const std::map<std::string, std::string>& user_metadata) {
  tc::WriteOptions opt;
  opt.user_metadata = user_metadata;
  opt.level = level;
  opt.block_elems = block_elems;
  opt.threads = threads;
  if (chunk_bytes) opt.chunk_bytes = chunk_bytes;
  opt.force = force;
  opt.predict = predict;
  opt.ref = ref;
  opt.ref_original = ref_original;
  if (min_gain >= 0) opt.min_gain = min_gain;
  tc::PassStats st;
  {
    nb::gil_scoped_release nogil;
    st = guarded([&] { return tc::compress_file(in, out, opt); }, {&in, &out, &ref, &ref_original});
  }
  return nb::make_tuple(st.raw_bytes, st.file_bytes);
}

// The validated header of a plain safetensors file (tc::read_safetensors_info):
// {"data_start", "file_size", "metadata", "tensors": [(name, dtype, shape, begin, end)]}
// with offsets relative to data_start, in data order. tensorzip.safe_open reads
// the tensors' bytes itself.
nb::dict safetensors_info(const std::string& path) {
  tc::SafetensorsInfo info;
  {
    nb::gil_scoped_release nogil;
    info = guarded([&] { return tc::read_safetensors_info(path); }, {&path});
  }
  nb::dict d;
  d["data_start"] = info.data_start;
  d["file_size"] = info.file_size;
  d["metadata"] = info.metadata;
  nb::list tensors;
  for (const auto& t : info.tensors) {
    nb::list shape;
    for (uint64_t x : t.shape) shape.append(x);
    tensors.append(nb::make_tuple(t.name, t.dtype, nb::tuple(shape), t.data_begin, t.data_end));
  }
  d["tensors"] = tensors;
  return d;
}

// The codec dtype (tz_dtype) the container uses for a safetensors dtype string; -1 if unknown.
int container_codec_dtype(const std::string& dtype) {
  tz_dtype d;
  return tc::codec_dtype_for(dtype, &d) ? static_cast<int>(d) : -1;
}

// Hugging Face model folders (tz::container::compress_folder / decompress_folder, as
// `tzip compress/decompress DIR`): every *.safetensors file <-> .tzip, other files copied.
void container_compress_folder(const std::string& in, const std::string& out, int level, unsigned threads,
                               bool force, bool predict) {
  tc::WriteOptions opt;
  opt.level = level;
  opt.threads = threads;
  opt.force = force;
  opt.predict = predict;
  nb::gil_scoped_release nogil;
  guarded([&] { tc::compress_folder(in, out, opt); }, {&in, &out});
}

void container_decompress_folder(const std::string& in, const std::string& out, unsigned threads, bool force) {
  tc::ReadOptions opt;
  opt.threads = threads;
  opt.force = force;
  nb::gil_scoped_release nogil;
  guarded([&] { tc::decompress_folder(in, out, opt); }, {&in, &out});
}

// Python-side handle of an open .tzip file. Every call on one Reader holds
// its mutex (the C++ Reader is not meant for concurrent use, and close() may
// come from another thread). The mutex is never held while waiting for the
// GIL: coding calls take it after releasing the GIL and drop it before
// taking the GIL back.
class PyReader {
 public:
  // refs: locations of referenced .tzip files (a whole chain may be given;
  // matched by checksum). check: open and check every reference now.
  PyReader(const std::string& path, unsigned threads, const std::vector<std::string>& refs, bool check)
      : threads_(threads) {
    nb::gil_scoped_release nogil;
    r_ = guarded([&] {
      auto r = std::make_unique<tc::Reader>(path, threads);
      if (!refs.empty()) r->add_reference_paths(refs);
      if (check) r->check_references();
      return r;
    }, {&path});
  }

  // [(recorded file, xxh64)] of the other .tzip files predicted tensors need.
  nb::list references() {
    std::lock_guard<std::mutex> lock(mu_);
    nb::list out;
    for (const auto& rf : get().references()) out.append(nb::make_tuple(rf.file, rf.xxh64));
    return out;
  }
  // [(name, kind, source, ref)] of the predicted tensors: kind "cast" or
  // "delta"; source: the cast's FP32 tensor (delta: the tensor's own name);
  // ref: index into references(), -1 for this file.
  nb::list predictions() {
    std::lock_guard<std::mutex> lock(mu_);
    nb::list out;
    for (const auto& t : get().tensors()) {
      if (t.predict.kind == tc::PredictKind::kNone) continue;
      const bool cast = t.predict.kind == tc::PredictKind::kCast;
      out.append(nb::make_tuple(t.name, cast ? "cast" : "delta", cast ? t.predict.source : t.name, t.predict.ref));
    }
    return out;
  }
  nb::tuple version() {
    std::lock_guard<std::mutex> lock(mu_);
    return nb::make_tuple(get().version_major(), get().version_minor());
  }
  uint64_t file_checksum() {
    std::lock_guard<std::mutex> lock(mu_);
    return get().file_checksum();
  }
  void check_references() {
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    tc::Reader& r = get();
    guarded([&] { r.check_references(); });
  }
  void close() {
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    r_.reset();
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return !r_;
  }

  // [(name, dtype, shape, raw_size, compressed_size)] in data order.
  nb::list tensors() {
    std::lock_guard<std::mutex> lock(mu_);
    nb::list out;
    for (const auto& t : get().tensors()) {
      nb::list shape;
      for (uint64_t s : t.shape) shape.append(s);
      out.append(nb::make_tuple(t.name, t.dtype, nb::tuple(shape), t.raw_size(), t.compressed_size()));
    }
    return out;
  }
  std::map<std::string, std::string> metadata() {
    std::lock_guard<std::mutex> lock(mu_);
    return get().metadata();
  }
  std::map<std::string, std::string> user_metadata() {
    std::lock_guard<std::mutex> lock(mu_);
    return get().user_metadata();
  }
  std::string path() {
    std::lock_guard<std::mutex> lock(mu_);
    return get().path();
  }
  uint64_t file_size() {
    std::lock_guard<std::mutex> lock(mu_);
    return get().file_size();
  }
  uint64_t original_size() {
    std::lock_guard<std::mutex> lock(mu_);
    return get().original_size();
  }
  std::string created_by() {
    std::lock_guard<std::mutex> lock(mu_);
    return get().created_by();
  }
  long find(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return get().find(name);
  }

  void read_tensor(size_t index, nb::handle dst_obj) {
    BufferView dst(dst_obj, true, "out");
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    tc::Reader& r = get();
    const tc::TensorEntry& t = entry(r, index);
    if (dst.size() != t.raw_size())
      throw PyErrorOf(g_usage, "output buffer has " + std::to_string(dst.size()) + " bytes, tensor '" + t.name +
                                   "' has " + std::to_string(t.raw_size()));
    // A tensor of several frames: its frames decoded in parallel on the
    // reader's threads (read_tensors); one frame: read_tensor.
    if (t.frames.size() > 1 && threads_ != 1)
      guarded([&] { r.read_tensors({tc::Reader::TensorRead{index, dst.wdata(), dst.size()}}, threads_); });
    else
      guarded([&] { r.read_tensor(index, dst.wdata(), dst.size()); });
  }

  // Several whole tensors at once (Reader::read_tensors): their frames are
  // decoded in parallel on the reader's threads, each into its buffer.
  void read_tensors(const std::vector<size_t>& indices, nb::list outs) {
    read_into("read_tensors", indices, outs, [&](tc::Reader& r, const std::vector<tc::Reader::TensorRead>& reads) {
      r.read_tensors(reads, threads_);
    });
  }

  // Every tensor of the file read whole (Reader::read_all): the whole-file
  // pass of verify, each listed tensor decoded into its buffer.
  void read_all(const std::vector<size_t>& indices, nb::list outs) {
    read_into("read_all", indices, outs, [&](tc::Reader& r, const std::vector<tc::Reader::TensorRead>& reads) {
      tc::ReadOptions opt;
      opt.threads = threads_;
      r.read_all(reads, opt);
    });
  }

  // The tensors `indices` into the buffers `outs` (each checked to hold
  // exactly its tensor) by read(reader, reads), without the GIL.
  template <class Read>
  void read_into(const char* what, const std::vector<size_t>& indices, nb::list outs, Read&& read) {
    if (outs.size() != indices.size())
      throw PyErrorOf(g_usage, std::string(what) + ": one output buffer per tensor index");
    std::vector<std::unique_ptr<BufferView>> views;
    views.reserve(indices.size());
    for (size_t k = 0; k < indices.size(); ++k) views.push_back(std::make_unique<BufferView>(outs[k], true, "out"));
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    tc::Reader& r = get();
    std::vector<tc::Reader::TensorRead> reads;
    reads.reserve(indices.size());
    for (size_t k = 0; k < indices.size(); ++k) {
      const tc::TensorEntry& t = entry(r, indices[k]);
      if (views[k]->size() != t.raw_size())
        throw PyErrorOf(g_usage, "output buffer has " + std::to_string(views[k]->size()) + " bytes, tensor '" +
                                     t.name + "' has " + std::to_string(t.raw_size()));
      reads.push_back(tc::Reader::TensorRead{indices[k], views[k]->wdata(), views[k]->size()});
    }
    guarded([&] { read(r, reads); });
  }

  void read_range(size_t index, uint64_t offset, nb::handle dst_obj) {
    BufferView dst(dst_obj, true, "out");
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    tc::Reader& r = get();
    const tc::TensorEntry& t = entry(r, index);
    if (offset > t.raw_size() || dst.size() > t.raw_size() - offset)
      throw PyErrorOf(g_usage, "byte range past the end of tensor '" + t.name + "'");
    guarded([&] { r.read_range(index, offset, dst.size(), dst.wdata()); });
  }

  nb::tuple export_safetensors(const std::string& out, unsigned threads, bool force) {
    tc::ReadOptions opt;
    opt.threads = threads;
    opt.force = force;
    tc::PassStats st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      tc::Reader& r = get();
      st = guarded([&] { return r.export_safetensors(out, opt); }, {&out, &r.path()});
    }
    return nb::make_tuple(st.raw_bytes, st.file_bytes);
  }

  void verify(const std::string& original, unsigned threads) {
    tc::ReadOptions opt;
    opt.threads = threads;
    nb::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu_);
    tc::Reader& r = get();
    guarded([&] { r.verify(original, opt); }, {&original, &r.path()});
  }

 private:
  // Callers hold mu_. Throws (C++ only, no Python API: fine without the GIL).
  tc::Reader& get() {
    if (!r_) throw PyErrorOf(PyExc_ValueError, "I/O operation on a closed tensorzip file");
    return *r_;
  }
  static const tc::TensorEntry& entry(tc::Reader& r, size_t index) {
    if (index >= r.tensors().size()) throw PyErrorOf(PyExc_IndexError, "tensor index out of range");
    return r.tensors()[index];
  }

  std::mutex mu_;
  std::unique_ptr<tc::Reader> r_;
  unsigned threads_;  // read_tensors: threads in all, 0 = all hardware threads
};

// ---- TensorWriter: a .tzip file from in-memory tensors (tensorzip.dcp) ----

// Python handle of a tc::TensorWriter. add() keeps a buffer view (and so the
// Python object) of every tensor until finish() or abort(): the writer reads
// the bytes only in finish(), which runs without the GIL. add_cuda() (builds
// with the CUDA backend) takes a device pointer: its chunks are encoded on
// the GPU in finish() (tz::checkpoint::gpu::WriterEncoder, batched across
// tensors), and the optional owner object is kept until then.
class PyTensorWriter {
 public:
  // user_metadata: .tzip header only; safetensors_header: the export's header JSON verbatim
  // ("" = made by the writer); ref: previous checkpoint for delta coding ("" = none);
  // ref_original: ref's content as a safetensors file, read instead of decoding ref.
  PyTensorWriter(const std::string& path, int level, unsigned threads, uint64_t chunk_bytes, bool direct_io,
                 bool predict, const std::map<std::string, std::string>& metadata, unsigned block_elems,
                 bool force, const std::string& io, unsigned io_threads,
                 const std::map<std::string, std::string>& user_metadata, const std::string& safetensors_header,
                 const std::string& ref, const std::string& ref_original)
      : level_(level), block_elems_(block_elems), ref_(ref), ref_original_(ref_original) {
    tc::TensorWriterOptions opt;
    opt.level = level;
    opt.threads = threads;
    if (chunk_bytes) opt.chunk_bytes = chunk_bytes;
    opt.block_elems = block_elems;
    opt.direct_io = direct_io;
    opt.predict = predict;
    opt.metadata = metadata;
    opt.user_metadata = user_metadata;
    opt.safetensors_header = safetensors_header;
    opt.ref = ref;
    opt.ref_original = ref_original;
    opt.force = force;
    if (io == "pwrite") {
      // the container's synchronous pwrite sink (opt.sink left empty)
    } else if (io == "auto" || io == "posix" || io == "io_uring" || io == "uring") {
#ifdef TZ_PY_HAVE_IO
      const tz::io::Backend be = io == "posix" ? tz::io::Backend::kPosix
                                 : io == "auto" ? tz::io::Backend::kAuto
                                                : tz::io::Backend::kUring;
      const unsigned nt = io_threads ? io_threads : 2;
      const unsigned depth = 16;
      opt.sink = [be, nt, depth](int fd, bool direct) -> std::unique_ptr<tc::Sink> {
        return std::make_unique<tz::io::QueueSink>(fd, be, nt, depth, /*writeback=*/!direct);
      };
#else
      if (io != "auto") throw PyErrorOf(g_usage, "io='" + io + "': this build has no I/O engine (src/io)");
#endif
    } else {
      throw PyErrorOf(g_usage, "io must be 'auto', 'posix', 'io_uring' or 'pwrite', not '" + io + "'");
    }
    nb::gil_scoped_release nogil;
    w_ = guarded([&] { return std::make_unique<tc::TensorWriter>(path, opt); }, {&path});
  }
  ~PyTensorWriter() {
    // Destroyed with the GIL held (nanobind): the writer drops its temporary.
    w_.reset();
    views_.clear();
    owners_.clear();
  }

  void add(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
           nb::handle data_obj) {
    tc::TensorWriter& w = get();
    auto view = std::make_unique<BufferView>(data_obj, false, "data");
    guarded([&] { w.add(name, dtype, shape, view->data(), view->size()); });
    views_.push_back(std::move(view));
  }

  // A tensor in CUDA device memory (data_ptr: its device address, e.g.
  // torch.Tensor.data_ptr(); nbytes: its size). The memory must stay valid
  // and unchanged until finish() returns, and work writing it must be
  // complete before finish() (the GPU encoder reads it on streams of its
  // own): synchronise the producing stream first. `owner` (e.g. the tensor)
  // is kept alive until finish() or abort().
  void add_cuda(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
                uintptr_t data_ptr, uint64_t nbytes, nb::object owner) {
    tc::TensorWriter& w = get();
#ifdef TZ_PY_HAVE_CUDA
    if (!genc_) genc_ = std::make_unique<tz::checkpoint::gpu::WriterEncoder>(level_);
    {
      nb::gil_scoped_release nogil;
      guarded([&] { genc_->add(w, name, dtype, shape, reinterpret_cast<const void*>(data_ptr), nbytes, block_elems_); });
    }
    owners_.push_back(std::move(owner));
#else
    (void)w;
    (void)data_ptr;
    (void)nbytes;
    (void)owner;
    throw PyErrorOf(g_usage, "tensor '" + name + "' (" + dtype + ", device memory): this tensorzip build has no CUDA "
                             "support (the Python module was built with TZ_CUDA=OFF); copy the tensor to the CPU and "
                             "use add(), or rebuild with pip install . -C cmake.define.TZ_CUDA=ON");
#endif
  }

  nb::dict finish() {
    tc::TensorWriter& w = get();
    tc::TensorWriterStats st;
    uint64_t gpu_bytes = 0, gpu_host_bytes = 0;
    try {
      nb::gil_scoped_release nogil;
#ifdef TZ_PY_HAVE_CUDA
      if (genc_) guarded([&] { genc_->start(); });
#endif
      st = guarded([&] { return w.finish(); }, {&w.path(), &ref_, &ref_original_});
#ifdef TZ_PY_HAVE_CUDA
      if (genc_) gpu_bytes = genc_->gpu_bytes(), gpu_host_bytes = genc_->host_bytes();
#endif
    } catch (...) {
      views_.clear();
      owners_.clear();
      throw;
    }
    views_.clear();
    owners_.clear();
    nb::dict d;
    d["gpu_bytes"] = gpu_bytes;
    d["gpu_host_bytes"] = gpu_host_bytes;
    d["raw_bytes"] = st.raw_bytes;
    d["file_bytes"] = st.file_bytes;
    d["encode_seconds"] = st.encode_seconds;
    d["seconds"] = st.seconds;
    d["io"] = st.io;
    d["direct"] = st.direct;
    d["predicted"] = st.predicted;
    d["file_xxh64"] = st.file_xxh64;
    nb::list tensors;
    for (const auto& t : w.tensors()) {
      nb::dict e;
      e["name"] = t.name;
      e["dtype"] = t.dtype;
      nb::list shape;
      for (uint64_t s : t.shape) shape.append(s);
      e["shape"] = nb::tuple(shape);
      e["raw_size"] = t.raw_size();
      e["compressed_size"] = t.compressed_size();
      e["block_bytes"] = t.block_bytes();
      e["n_blocks"] = t.n_blocks();
      e["predicted"] = t.predict.kind != tc::PredictKind::kNone;
      nb::list frames;
      for (const auto& f : t.frames) frames.append(nb::make_tuple(f.offset, f.size, f.raw_size));
      e["frames"] = frames;
      tensors.append(e);
    }
    d["tensors"] = tensors;
    return d;
  }

  void abort() {
    if (w_) {
      nb::gil_scoped_release nogil;
      w_->abort();
    }
    views_.clear();
    owners_.clear();
  }

  std::string path() { return get().path(); }
  size_t size() const { return views_.size() + owners_.size(); }

 private:
  tc::TensorWriter& get() {
    if (!w_) throw PyErrorOf(PyExc_ValueError, "tensorzip.TensorWriter is closed");
    return *w_;
  }
  int level_;
  unsigned block_elems_;
  std::string ref_, ref_original_;
#ifdef TZ_PY_HAVE_CUDA
  std::unique_ptr<tz::checkpoint::gpu::WriterEncoder> genc_;  // outlives w_'s finish(); destroyed after w_
#endif
  std::unique_ptr<tc::TensorWriter> w_;
  std::vector<std::unique_ptr<BufferView>> views_;
  std::vector<nb::object> owners_;  // objects owning add_cuda() memory
};
#endif

// True when this module was built with the CUDA backend and a CUDA device
// is visible (initialises the CUDA runtime in a build with CUDA).
bool cuda_available() {
#ifdef TZ_PY_HAVE_CUDA
  nb::gil_scoped_release nogil;
  return tz::checkpoint::gpu::device_count() > 0;
#else
  return false;
#endif
}

PyObject* new_exception(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string full = std::string("tensorzip.") + name;
  PyObject* e = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  if (!e) throw nb::python_error();
  m.attr(name) = nb::handle(e);
  return e;
}

}  // namespace

void bind_resident(nb::module_& m);  // resident_module.cpp
void bind_kv(nb::module_& m);  // kv_module.cpp: the KV page codec

// The writers' option rules (tz::container::check_write_options; the codec's
// alone in a build without the container). chunk_bytes 0: not given.
static void check_write_options(int64_t level, uint64_t block_elems, uint64_t chunk_bytes) {
  if (level < INT32_MIN || level > INT32_MAX) level = INT32_MIN;  // out of range either way
#ifdef TZ_PY_HAVE_CONTAINER
  guarded([&] {
    tc::check_level((int)level);
    tc::check_block_elems(block_elems);
    if (chunk_bytes) tc::check_chunk_bytes(chunk_bytes);
  });
#else
  if (const char* e = tz::policy_option_error((int)level, block_elems)) throw PyErrorOf(g_usage, e);
  if (chunk_bytes) throw PyErrorOf(g_usage, "this build has no .tzip container");
#endif
}

NB_MODULE(_tensorzip, m) {
  m.doc() = "Low-level bindings of the tensorzip codec and .tzip container (use the tensorzip package).";

  g_error = new_exception(m, "TensorZipError", PyExc_Exception, "Base class of every tensorzip error.");
  g_corrupt = new_exception(m, "CorruptDataError",
                            nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError)).release().ptr(),
                            "Input is not valid tensorzip data: bad magic, truncated, corrupt or checksum mismatch.");
  g_usage = new_exception(m, "UsageError",
                          nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError)).release().ptr(),
                          "Invalid argument or option.");
  g_io = new_exception(m, "TensorZipIOError",
                       nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_OSError)).release().ptr(),
                       "A file could not be opened, read, written or renamed.");
  g_exists = new_exception(m, "TensorZipExistsError",
                           nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_FileExistsError)).release().ptr(),
                           "The output file exists and overwriting was not allowed.");
  g_not_found = new_exception(m, "TensorZipFileNotFoundError",
                              nb::make_tuple(nb::handle(g_io), nb::handle(PyExc_FileNotFoundError)).release().ptr(),
                              "A file (an input, a reference, an output folder) does not exist (errno ENOENT).");
  g_permission = new_exception(m, "TensorZipPermissionError",
                               nb::make_tuple(nb::handle(g_io), nb::handle(PyExc_PermissionError)).release().ptr(),
                               "A file or folder cannot be opened or created for lack of permission (EACCES, EPERM).");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const PyErrorOf& e) {
      if (e.sys_errno == 0 && e.filename.empty()) {
        PyErr_SetString(e.type, e.what());
        return;
      }
      // An OS error: the message as str(e), plus errno / strerror / filename.
      PyObject* exc = PyObject_CallFunction(e.type, "s", e.what());
      if (!exc) return;  // the constructor's error is set
      if (e.sys_errno) {
        PyObject* no = PyLong_FromLong(e.sys_errno);
        PyObject* text = PyUnicode_FromString(std::strerror(e.sys_errno));
        if (no) PyObject_SetAttrString(exc, "errno", no);
        if (text) PyObject_SetAttrString(exc, "strerror", text);
        Py_XDECREF(no);
        Py_XDECREF(text);
      }
      if (!e.filename.empty()) {
        PyObject* fn = PyUnicode_DecodeFSDefault(e.filename.c_str());
        if (fn) PyObject_SetAttrString(exc, "filename", fn);
        Py_XDECREF(fn);
      }
      PyErr_Clear();
      PyErr_SetObject(e.type, exc);
      Py_DECREF(exc);
    }
  });

  m.attr("VERSION") = nb::make_tuple(TZ_VERSION_MAJOR, TZ_VERSION_MINOR, TZ_VERSION_PATCH);
  m.attr("FORMAT_VERSION") = TZ_FORMAT_VERSION;
#ifdef TZ_PY_HAVE_CONTAINER
  m.attr("HAVE_CONTAINER") = true;
  m.attr("CONTAINER_VERSION") = nb::make_tuple(tz::container::kTzipVersionMajor, tz::container::kTzipVersionMinor);
#else
  m.attr("HAVE_CONTAINER") = false;
#endif
#ifdef TZ_PY_HAVE_CUDA
  m.attr("HAVE_CUDA") = true;
#else
  m.attr("HAVE_CUDA") = false;
#endif
  m.def("cuda_available", &cuda_available,
        "True when the module was built with CUDA (TensorWriter.add_cuda encodes on the GPU) and a CUDA device "
        "is visible.");
  m.def("library_version", [] { return tz_version_number(); });
  m.def("simd_path", [] { return std::string(tz_simd_path()); },
        "The CPU kernel set the codec runs here: portable, avx2, avx512 or neon (TZ_SIMD forces one).");
  m.def("simd_kernels", [] { return std::string(tz_simd_kernels()); },
        "The kernel table in use, in words: simd_path() and, for avx512, which of its two tables.");
  m.def("compress_bound", &tz_compress_bound, "size"_a);
  m.def("check_write_options", &check_write_options, "level"_a, "block_elems"_a, "chunk_bytes"_a = 0,
        "Raises UsageError for options the writers refuse (chunk_bytes 0: the default, not checked).");
  m.def("compress", &compress, "prefix"_a, "data"_a, "dtype"_a, "level"_a = 0, "block_elems"_a = 0u,
        "threads"_a = 0u, "Returns prefix + one codec frame of data (GIL released while coding).");
  m.def("decompress_into", &decompress_into, "data"_a, "offset"_a, "out"_a, "threads"_a = 0u,
        "Decodes the frame data[offset:] into the writable buffer out (GIL released).");
  m.def("frame_info", &frame_info, "data"_a, "offset"_a = 0, "Header fields of the frame at data[offset:].");
  m.def("frame_prefix_size", [](nb::handle src_obj, size_t offset) {
        BufferView src(src_obj, false, "data");
        if (offset > src.size()) throw PyErrorOf(g_corrupt, "truncated input: frame offset past the end");
        const size_t r = tz_frame_prefix_size(src.data() + offset, src.size() - offset);
        if (tz_is_error(r)) throw_codec(r, "invalid frame");
        return r;
      }, "data"_a, "offset"_a = 0, "Bytes of the frame at data[offset:] up to the end of its block index (give >= 32).");
  m.def("frame_block_range", &frame_block_range, "prefix"_a, "first"_a, "count"_a,
        "(offset, size, raw_offset, raw_size) of blocks [first, first+count) of a frame, from its prefix.");
  m.def("decompress_blocks_into", &decompress_blocks_into, "prefix"_a, "blocks"_a, "first"_a, "count"_a, "out"_a,
        "out_offset"_a = 0, "threads"_a = 0u,
        "Decodes blocks [first, first+count) of a frame into out[out_offset:] (GIL released).");

#ifdef TZ_PY_HAVE_CONTAINER
  m.def("compress_file", &container_compress_file, "src"_a, "dst"_a, "level"_a = 0, "block_elems"_a = 0u,
        "threads"_a = 0u, "chunk_bytes"_a = 0, "force"_a = false, "predict"_a = true, "ref"_a = "",
        "ref_original"_a = "", "min_gain"_a = -1.0, "user_metadata"_a = std::map<std::string, std::string>(),
        "Compresses a safetensors file into a .tzip file; returns (raw_bytes, file_bytes).");
  m.def("compress_folder", &container_compress_folder, "src"_a, "dst"_a, "level"_a = 0, "threads"_a = 0u,
        "force"_a = false, "predict"_a = true,
        "Compresses a model folder like `tzip compress DIR`: *.safetensors -> .tzip, other files copied.");
  m.def("decompress_folder", &container_decompress_folder, "src"_a, "dst"_a, "threads"_a = 0u, "force"_a = false,
        "Restores a compressed model folder like `tzip decompress DIR` (byte-identical).");
  m.def("safetensors_info", &safetensors_info, "path"_a,
        "Validated header of a safetensors file: data_start, file_size, metadata, tensors [(name, dtype, shape, "
        "begin, end)] in data order.");
  m.def("codec_dtype_for", &container_codec_dtype, "dtype"_a,
        "Codec dtype the container uses for a safetensors dtype string (-1: unknown dtype).");
  nb::class_<PyReader>(m, "Reader")
      .def(nb::init<const std::string&, unsigned, const std::vector<std::string>&, bool>(), "path"_a,
           "threads"_a = 0u, "refs"_a = std::vector<std::string>(), "check"_a = false)
      .def("references", &PyReader::references)
      .def("predictions", &PyReader::predictions)
      .def("version", &PyReader::version)
      .def_prop_ro("file_checksum", &PyReader::file_checksum)
      .def("check_references", &PyReader::check_references)
      .def("close", &PyReader::close)
      .def_prop_ro("closed", &PyReader::closed)
      .def("tensors", &PyReader::tensors)
      .def("metadata", &PyReader::metadata)
      .def("user_metadata", &PyReader::user_metadata)
      .def_prop_ro("path", &PyReader::path)
      .def_prop_ro("file_size", &PyReader::file_size)
      .def_prop_ro("original_size", &PyReader::original_size)
      .def_prop_ro("created_by", &PyReader::created_by)
      .def("find", &PyReader::find, "name"_a)
      .def("read_tensor", &PyReader::read_tensor, "index"_a, "out"_a)
      .def("read_tensors", &PyReader::read_tensors, "indices"_a, "outs"_a,
           "Reads whole tensors into the buffers outs[k] (frames decoded in parallel, GIL released).")
      .def("read_all", &PyReader::read_all, "indices"_a, "outs"_a,
           "Whole tensors read by the whole-file pass of verify (every checksum, padding byte and the whole-file "
           "checksum checked): load_file.")
      .def("read_range", &PyReader::read_range, "index"_a, "offset"_a, "out"_a)
      .def("export_safetensors", &PyReader::export_safetensors, "out"_a, "threads"_a = 0u, "force"_a = false)
      .def("verify", &PyReader::verify, "original"_a = "", "threads"_a = 0u);
  nb::class_<PyTensorWriter>(m, "TensorWriter")
      .def(nb::init<const std::string&, int, unsigned, uint64_t, bool, bool, const std::map<std::string, std::string>&,
                    unsigned, bool, const std::string&, unsigned, const std::map<std::string, std::string>&,
                    const std::string&, const std::string&, const std::string&>(),
           "path"_a, "level"_a = 0, "threads"_a = 0u, "chunk_bytes"_a = 0, "direct_io"_a = false,
           "predict"_a = false, "metadata"_a = std::map<std::string, std::string>(), "block_elems"_a = 0u,
           "force"_a = false, "io"_a = "auto", "io_threads"_a = 0u,
           "user_metadata"_a = std::map<std::string, std::string>(), "safetensors_header"_a = "", "ref"_a = "",
           "ref_original"_a = "")
      .def("add", &PyTensorWriter::add, "name"_a, "dtype"_a, "shape"_a, "data"_a)
      .def("add_cuda", &PyTensorWriter::add_cuda, "name"_a, "dtype"_a, "shape"_a, "data_ptr"_a, "nbytes"_a,
           "owner"_a.none() = nb::none(),
           "A tensor in CUDA device memory, encoded on the GPU in finish() (builds with CUDA; else UsageError). "
           "Synchronise the stream that wrote it first; it must stay unchanged until finish() returns.")
      .def("finish", &PyTensorWriter::finish)
      .def("abort", &PyTensorWriter::abort)
      .def_prop_ro("path", &PyTensorWriter::path)
      .def("__len__", &PyTensorWriter::size)
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](PyTensorWriter& w, nb::handle type, nb::handle, nb::handle) {
            if (!type.is_none()) w.abort();  // an exception inside the block: no file is left
            return false;
          }, "exc_type"_a.none(), "exc"_a.none(), "tb"_a.none());
#endif
  bind_resident(m);
  bind_kv(m);
}

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
#include "module_common.hpp"
#include "tensorzip/tensorzip.h"
#ifdef TZ_PY_HAVE_CUDA
#include "checkpoint_gpu.hpp"  // tz::checkpoint::gpu::device_count (src/checkpoint)
#endif

namespace nb = nanobind;
using namespace nb::literals;


namespace tz_py {

std::string codec_error_message(size_t code, const std::string& what) {
  std::string msg = what + ": " + tz_get_error_name(code);
  const char* detail = tz_last_error_detail();
  if (detail && *detail) msg += std::string(" (") + detail + ")";
  return msg;
}

[[noreturn]] void throw_codec(size_t code, const std::string& what) {
  PyObject* type = g_error;
  switch (tz_get_error_code(code)) {
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
  throw PyErrorOf(type, codec_error_message(code, what));
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

[[noreturn]] void rethrow_container(const tc::Error& e, std::initializer_list<const std::string*> files) {
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
#endif

}  // namespace tz_py

using namespace tz_py;

namespace {

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
  if (tz_is_error(r)) throw_codec(r, "decoding block " + std::to_string(bad) + " failed");
  return r;
}

#ifdef TZ_PY_HAVE_CONTAINER
// predict: cast prediction (BF16/F16 from an FP32 tensor of the same file);
// ref: previous checkpoint's .tzip (delta), "" for none; ref_original: the
// verified safetensors export of ref (predictor bytes read from it instead
// of decoding ref), "" for none; min_gain < 0: the library default.
nb::tuple container_compress_file(const std::string& in, const std::string& out, int level, unsigned block_elems,
                                  unsigned threads, uint64_t chunk_bytes, bool force, bool predict,
                                  const std::string& ref, const std::string& ref_original, double min_gain,
                                  const std::map<std::string, std::string>& user_metadata) {
  tc::WriteOptions opt;
  set_writer_options(opt, {.level = level, .block_elems = block_elems, .threads = threads, .chunk_bytes = chunk_bytes,
                           .force = force, .predict = predict, .ref = ref, .ref_original = ref_original,
                           .min_gain = min_gain, .user_metadata = user_metadata});
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
  WriterArgs args;
  args.level = level;
  args.threads = threads;
  args.force = force;
  args.predict = predict;
  set_writer_options(opt, args);
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

// An exception class that is both a tensorzip error (`base`) and a built-in one (`builtin`).
PyObject* new_exception(nb::module_& m, const char* name, PyObject* base, PyObject* builtin, const char* doc) {
  return new_exception(m, name, nb::make_tuple(nb::handle(base), nb::handle(builtin)).release().ptr(), doc);
}

}  // namespace

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
  g_corrupt = new_exception(m, "CorruptDataError", g_error, PyExc_ValueError,
                            "Input is not valid tensorzip data: bad magic, truncated, corrupt or checksum mismatch.");
  g_usage = new_exception(m, "UsageError", g_error, PyExc_ValueError, "Invalid argument or option.");
  g_io = new_exception(m, "TensorZipIOError", g_error, PyExc_OSError,
                       "A file could not be opened, read, written or renamed.");
  g_exists = new_exception(m, "TensorZipExistsError", g_error, PyExc_FileExistsError,
                           "The output file exists and overwriting was not allowed.");
  g_not_found = new_exception(m, "TensorZipFileNotFoundError", g_io, PyExc_FileNotFoundError,
                              "A file (an input, a reference, an output folder) does not exist (errno ENOENT).");
  g_permission = new_exception(m, "TensorZipPermissionError", g_io, PyExc_PermissionError,
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
  bind_reader(m);
  bind_tensor_writer(m);
#endif
  bind_resident(m);
  bind_kv(m);
}

// What the binding files of tensorzip._tensorzip share (tensorzip_module.cpp
// defines the functions): the module's exception classes, the C++ exception
// that becomes one of them, codec error messages, buffer views and, with the
// container, the writers' options and the translation of tz::container::Error.
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "tensorzip/tensorzip.h"
#ifdef TZ_PY_HAVE_CONTAINER
#include "tensorzip/container.hpp"
#endif

namespace tz_py {
namespace nb = nanobind;

// Exception classes (created in module init, owned by the module).
inline PyObject* g_error = nullptr;          // TensorZipError(Exception)
inline PyObject* g_corrupt = nullptr;        // CorruptDataError(TensorZipError, ValueError)
inline PyObject* g_usage = nullptr;          // UsageError(TensorZipError, ValueError)
inline PyObject* g_io = nullptr;             // TensorZipIOError(TensorZipError, OSError)
inline PyObject* g_exists = nullptr;         // TensorZipExistsError(TensorZipError, FileExistsError)
inline PyObject* g_not_found = nullptr;      // TensorZipFileNotFoundError(TensorZipIOError, FileNotFoundError)
inline PyObject* g_permission = nullptr;     // TensorZipPermissionError(TensorZipIOError, PermissionError)

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

// "what: error name (detail)" for a codec error code (tz_last_error_detail()).
std::string codec_error_message(size_t code, const std::string& what);

// Throws for a codec error code; call with the GIL held or not (no Python API).
[[noreturn]] void throw_codec(size_t code, const std::string& what);

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

#ifdef TZ_PY_HAVE_CONTAINER
// `files`: the paths a call works on; an OS error names the one its message starts with.
[[noreturn]] void rethrow_container(const tz::container::Error& e, std::initializer_list<const std::string*> files = {});

template <class F>
auto guarded(F&& f, std::initializer_list<const std::string*> files = {}) -> decltype(f()) {
  try {
    return f();
  } catch (const tz::container::Error& e) {
    rethrow_container(e, files);
  }
}

// The options of a .tzip writer as the Python API passes them. 0 (chunk_bytes)
// and a negative min_gain mean "not given": the library's default stays.
struct WriterArgs {
  int level = 0;
  unsigned block_elems = 0;  // 0: the codec's default for the dtype
  unsigned threads = 0;      // 0: all hardware threads
  uint64_t chunk_bytes = 0;
  bool force = false;
  bool predict = true;
  std::string ref, ref_original;  // "" : none
  double min_gain = -1;
  std::map<std::string, std::string> user_metadata;
};

// The fields tc::WriteOptions (compress_file, compress_folder) and
// tc::TensorWriterOptions (TensorWriter) share, set from `a` in one place.
template <class Options>
void set_writer_options(Options& opt, const WriterArgs& a) {
  opt.level = a.level;
  opt.block_elems = a.block_elems;
  opt.threads = a.threads;
  if (a.chunk_bytes) opt.chunk_bytes = a.chunk_bytes;
  opt.force = a.force;
  opt.predict = a.predict;
  opt.ref = a.ref;
  opt.ref_original = a.ref_original;
  if (a.min_gain >= 0) opt.min_gain = a.min_gain;
  opt.user_metadata = a.user_metadata;
}

void bind_reader(nb::module_& m);         // reader_module.cpp: class Reader
void bind_tensor_writer(nb::module_& m);  // writer_module.cpp: class TensorWriter
#endif

void bind_resident(nb::module_& m);  // resident_module.cpp: class ResidentPlan, raw .tzip frames
void bind_kv(nb::module_& m);        // kv_module.cpp: class KvCodec, kv_calibrate, kv_load

}  // namespace tz_py

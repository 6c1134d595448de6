// tensorzip._tensorzip.Reader: an open .tzip file (tz::container::Reader) for
// the Python package's safe_open, load_file and export.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "module_common.hpp"

namespace tz_py {
namespace tc = tz::container;
using namespace nb::literals;

namespace {

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

}  // namespace

void bind_reader(nb::module_& m) {
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
}

}  // namespace tz_py

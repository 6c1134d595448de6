// tensorzip._tensorzip.TensorWriter: a .tzip file written from in-memory (or,
// with the CUDA backend, device) tensors: tensorzip.torch.save_file, tensorzip.dcp.
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
#ifdef TZ_PY_HAVE_IO
#include "queue_sink.hpp"
#endif
#ifdef TZ_PY_HAVE_CUDA
#include "checkpoint_gpu.hpp"  // tz::checkpoint::gpu::WriterEncoder (src/checkpoint)
#endif

namespace tz_py {
namespace tc = tz::container;
using namespace nb::literals;

namespace {

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
    set_writer_options(opt, {.level = level, .block_elems = block_elems, .threads = threads,
                             .chunk_bytes = chunk_bytes, .force = force, .predict = predict, .ref = ref,
                             .ref_original = ref_original, .user_metadata = user_metadata});
    opt.direct_io = direct_io;
    opt.metadata = metadata;
    opt.safetensors_header = safetensors_header;
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

}  // namespace

void bind_tensor_writer(nb::module_& m) {
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
}

}  // namespace tz_py

// Bindings of the KV page codec (include/tensorzip/tensorzip_kv.h, doc/kv.md)
// under tensorzip._tensorzip: class KvCodec and kv_calibrate / kv_load. Bytes
// in and out through the buffer protocol; the GIL is released while coding.
// python/tensorzip/kv builds the tensor API (shapes, dtypes, batches) on it.
// With the CUDA kernels (TZ_PY_HAVE_KV_CUDA; include/tensorzip/tensorzip_kv_cuda.h)
// KvCodec also codes batches of pages in device memory: pointers cross as
// integers (torch.Tensor.data_ptr()), the stream as an int; the Python layer
// (tensorzip/kv/_cuda.py) owns every buffer and reads the per-page statuses.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/codec.hpp"  // src/kv: the codec with an explicit kernel set for batches
#include "module_common.hpp"
#include "tensorzip/tensorzip_kv.h"
#ifdef TZ_PY_HAVE_KV_CUDA
#include "tensorzip/tensorzip_kv_cuda.h"
#endif

namespace tz_py {
using namespace nb::literals;

namespace {

// A codec error of the KV page codec: as throw_codec, and a destination too
// small or an unsupported layout is the caller's error (UsageError).
[[noreturn]] void throw_kv(size_t code, const std::string& what) {
  const tz_error_code ec = tz_get_error_code(code);
  if (ec == TZ_ERROR_DST_TOO_SMALL || ec == TZ_ERROR_UNSUPPORTED)
    throw PyErrorOf(g_usage, codec_error_message(code, what));
  throw_codec(code, what);
}

nb::bytes new_bytes(const uint8_t* p, size_t n) { return nb::bytes(reinterpret_cast<const char*>(p), n); }

#ifdef TZ_PY_HAVE_KV_CUDA
void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// The C API's handle of a codec with the same tables (tz_kv_codec_load of its
// blob): the CUDA kernels take a tz_kv_codec.
struct CHandle {
  tz_kv_codec* c = nullptr;
  ~CHandle() { tz_kv_codec_free(c); }
};

// Items of a batch of n pages: page i at src + src_off[i] (src_off[i + 1] -
// src_off[i] bytes), its result at dst + i * dst_stride (dst_capacity bytes).
std::vector<tz_kv_cuda_item> cuda_items(uintptr_t src, const std::vector<size_t>& src_off, uintptr_t dst,
                                        size_t dst_stride, size_t dst_capacity) {
  std::vector<tz_kv_cuda_item> items(src_off.empty() ? 0 : src_off.size() - 1);
  for (size_t i = 0; i < items.size(); ++i) {
    if (src_off[i + 1] < src_off[i]) throw PyErrorOf(g_usage, "KV CUDA: page offsets must not decrease");
    items[i] = {static_cast<const uint8_t*>(as_ptr(src)) + src_off[i], src_off[i + 1] - src_off[i],
                static_cast<uint8_t*>(as_ptr(dst)) + i * dst_stride, dst_capacity};
  }
  return items;
}

std::vector<size_t> uniform_offsets(size_t n, size_t page_bytes) {
  std::vector<size_t> off(n + 1);
  for (size_t i = 0; i <= n; ++i) off[i] = i * page_bytes;
  return off;
}
#endif

class PyKvCodec {
 public:
  explicit PyKvCodec(std::unique_ptr<tz::kv::Codec> c) : c_(std::move(c)) {}

  nb::bytes tables() const { return new_bytes(c_->blob().data(), c_->blob().size()); }

  nb::dict info() const {
    const tz::kv::KvTables& t = c_->tables().t;
    nb::dict d;
    d["dtype"] = (int)t.dtype;
    d["mode"] = t.mode == tz::kv::kModeFixedTables ? "fixed" : "rans";
    d["fixed_bits"] = (int)t.fixed_bits;
    d["checksum"] = (t.flags & tz::kv::kFlagChecksum) != 0;
    d["table_id"] = t.id;
    std::vector<uint32_t> dims(t.row_dims, t.row_dims + t.n_row_dims);
    d["row_dims"] = nb::tuple(nb::cast(dims));
    std::vector<bool> coded;
    for (int k = 0; k < t.n_streams; ++k) coded.push_back(t.mode == tz::kv::kModeRansTables && t.st[k].kind == tz::kKindRans);
    d["stream_coded"] = nb::cast(coded);
    return d;
  }

  size_t bound(size_t page_bytes) const {
    const size_t r = c_->page_bound(page_bytes);
    if (tz_is_error(r)) throw_kv(r, "KV page bound");
    return r;
  }

  nb::bytes encode(nb::handle page_obj) const {
    BufferView page(page_obj, false, "page");
    std::vector<uint8_t> out(bound(page.size()));
    size_t r;
    {
      nb::gil_scoped_release nogil;
      r = c_->encode(tz::kv::active_page_kernels(), out.data(), out.size(), page.data(), page.size());
    }
    if (tz_is_error(r)) throw_kv(r, "KV encode");
    return new_bytes(out.data(), r);
  }

  size_t decoded_size(nb::handle blob_obj) const {
    BufferView blob(blob_obj, false, "page");
    const size_t r = c_->decoded_size(blob.data(), blob.size());
    if (tz_is_error(r)) throw_kv(r, "KV page");
    return r;
  }

  // Decodes into the writable buffer out (exactly the page's size).
  size_t decode_into(nb::handle blob_obj, nb::handle out_obj) const {
    BufferView blob(blob_obj, false, "page");
    BufferView out(out_obj, true, "out");
    size_t r;
    {
      nb::gil_scoped_release nogil;
      r = c_->decode(tz::kv::active_page_kernels(), out.wdata(), out.size(), blob.data(), blob.size());
    }
    if (tz_is_error(r)) throw_kv(r, "KV decode");
    if (r != out.size()) throw PyErrorOf(g_usage, "KV decode: out holds " + std::to_string(out.size()) +
                                                         " bytes, the page decodes to " + std::to_string(r));
    return r;
  }

  // n_pages pages of page_bytes each, back to back in src: (blob, offsets)
  // with page i at blob[offsets[i]:offsets[i+1]].
  std::tuple<nb::bytes, std::vector<size_t>> encode_batch(nb::handle src_obj, size_t page_bytes, unsigned threads) const {
    BufferView src(src_obj, false, "pages");
    if (page_bytes == 0 || src.size() % page_bytes)
      throw PyErrorOf(g_usage, "KV encode_batch: " + std::to_string(src.size()) + " bytes are not whole pages of " +
                                      std::to_string(page_bytes));
    const size_t n = src.size() / page_bytes, b = bound(page_bytes);
    std::vector<uint8_t> arena(n * b);
    std::vector<tz_kv_item> items(n);
    for (size_t i = 0; i < n; ++i) items[i] = {src.data() + i * page_bytes, page_bytes, arena.data() + i * b, b, 0};
    size_t r;
    {
      nb::gil_scoped_release nogil;
      r = c_->encode_batch(tz::kv::active_page_kernels(), items.data(), n, threads);
    }
    if (tz_is_error(r)) throw_kv(r, "KV encode_batch");
    std::vector<size_t> offsets(n + 1, 0);
    for (size_t i = 0; i < n; ++i) offsets[i + 1] = offsets[i] + items[i].result;
    PyObject* out = PyBytes_FromStringAndSize(nullptr, (Py_ssize_t)offsets[n]);
    if (!out) throw nb::python_error();
    nb::bytes res = nb::steal<nb::bytes>(out);
    char* dst = PyBytes_AS_STRING(out);
    for (size_t i = 0; i < n; ++i) std::memcpy(dst + offsets[i], arena.data() + i * b, items[i].result);
    return {res, offsets};
  }

  // Pages (a list of bytes-like) into out, page i at out[i * page_bytes:].
  void decode_batch(const std::vector<nb::object>& blobs, nb::handle out_obj, size_t page_bytes, unsigned threads) const {
    BufferView out(out_obj, true, "out");
    const size_t n = blobs.size();
    if (page_bytes == 0 || out.size() != n * page_bytes)
      throw PyErrorOf(g_usage, "KV decode_batch: out must hold " + std::to_string(n) + " pages of " +
                                      std::to_string(page_bytes) + " bytes");
    std::vector<std::unique_ptr<BufferView>> views;
    std::vector<tz_kv_item> items(n);
    for (size_t i = 0; i < n; ++i) {
      views.push_back(std::make_unique<BufferView>(blobs[i], false, "page"));
      items[i] = {views[i]->data(), views[i]->size(), out.wdata() + i * page_bytes, page_bytes, 0};
    }
    size_t r;
    {
      nb::gil_scoped_release nogil;
      r = c_->decode_batch(tz::kv::active_page_kernels(), items.data(), n, threads);
    }
    if (tz_is_error(r)) throw_kv(r, "KV decode_batch");
    for (size_t i = 0; i < n; ++i)
      if (items[i].result != page_bytes)
        throw PyErrorOf(g_usage, "KV decode_batch: page " + std::to_string(i) + " decodes to " +
                                        std::to_string(items[i].result) + " bytes, not " + std::to_string(page_bytes));
  }

#ifdef TZ_PY_HAVE_KV_CUDA
  // Copies the tables to d_tables (kv_cuda_tables_size() bytes of device memory) on stream.
  void cuda_upload_tables(uintptr_t d_tables, size_t capacity, uintptr_t stream) {
    const size_t r = tz_kv_cuda_upload_tables(handle(), as_ptr(d_tables), capacity, as_stream(stream));
    if (tz_is_error(r)) throw_kv(r, "KV CUDA tables upload");
  }

  // n pages of page_bytes back to back at src -> page i at dst + i * dst_stride
  // (dst_stride >= bound(page_bytes)); sizes (size_t[n]) and status (int[n]) in device memory.
  size_t cuda_encode_temp_size(size_t page_bytes, size_t n) {
    const auto items = cuda_items(1, uniform_offsets(n, page_bytes), 1, 0, bound(page_bytes));
    const size_t r = tz_kv_cuda_encode_temp_size(handle(), items.data(), n);
    if (tz_is_error(r)) throw_kv(r, "KV CUDA encode");
    return r;
  }
  void cuda_encode(uintptr_t d_tables, uintptr_t src, size_t page_bytes, size_t n, uintptr_t dst, size_t dst_stride,
                   uintptr_t temp, size_t temp_size, uintptr_t sizes, uintptr_t status, uintptr_t stream) {
    if (dst_stride < bound(page_bytes))
      throw PyErrorOf(g_usage, "KV CUDA encode: a stride of " + std::to_string(dst_stride) + " bytes per page, " +
                                   std::to_string(bound(page_bytes)) + " needed");
    const auto items = cuda_items(src, uniform_offsets(n, page_bytes), dst, dst_stride, dst_stride);
    run(tz_kv_cuda_encode, "KV CUDA encode", d_tables, items, temp, temp_size, sizes, status, stream);
  }

  // Encoded pages at src + offsets[i] .. offsets[i + 1] -> page i at dst + i * page_bytes.
  size_t cuda_decode_temp_size(const std::vector<size_t>& offsets, size_t page_bytes) {
    const auto items = cuda_items(1, offsets, 1, 0, page_bytes);
    const size_t r = tz_kv_cuda_decode_temp_size(handle(), items.data(), items.size());
    if (tz_is_error(r)) throw_kv(r, "KV CUDA decode");
    return r;
  }
  void cuda_decode(uintptr_t d_tables, uintptr_t src, const std::vector<size_t>& offsets, uintptr_t dst,
                   size_t page_bytes, uintptr_t temp, size_t temp_size, uintptr_t sizes, uintptr_t status,
                   uintptr_t stream) {
    const auto items = cuda_items(src, offsets, dst, page_bytes, page_bytes);
    run(tz_kv_cuda_decode, "KV CUDA decode", d_tables, items, temp, temp_size, sizes, status, stream);
  }
#endif

 private:
#ifdef TZ_PY_HAVE_KV_CUDA
  using CudaRun = size_t (*)(const tz_kv_codec*, const void*, const tz_kv_cuda_item*, size_t, void*, size_t, size_t*,
                             int*, cudaStream_t);
  void run(CudaRun f, const char* what, uintptr_t d_tables, const std::vector<tz_kv_cuda_item>& items, uintptr_t temp,
           size_t temp_size, uintptr_t sizes, uintptr_t status, uintptr_t stream) {
    tz_kv_codec* c = handle();
    size_t r;
    {
      nb::gil_scoped_release nogil;
      r = f(c, as_ptr(d_tables), items.data(), items.size(), as_ptr(temp), temp_size,
            static_cast<size_t*>(as_ptr(sizes)), static_cast<int*>(as_ptr(status)), as_stream(stream));
    }
    if (tz_is_error(r))
      throw PyErrorOf(g_usage, std::string(what) + " could not start: " + tz_get_error_name(r));
  }
  tz_kv_codec* handle() {
    if (!h_) {
      auto h = std::make_unique<CHandle>();
      const size_t r = tz_kv_codec_load(&h->c, c_->blob().data(), c_->blob().size());
      if (tz_is_error(r)) throw_kv(r, "KV tables");
      h_ = std::move(h);
    }
    return h_->c;
  }
  std::unique_ptr<CHandle> h_;
#endif
  std::unique_ptr<tz::kv::Codec> c_;
};

PyKvCodec kv_calibrate(nb::handle sample_obj, int dtype, const std::string& mode, unsigned fixed_bits, bool checksum,
                       const std::vector<uint32_t>& row_dims) {
  BufferView sample(sample_obj, false, "sample");
  tz_kv_params p{};
  if (mode == "rans") p.mode = TZ_KV_MODE_RANS;
  else if (mode == "fixed") p.mode = TZ_KV_MODE_FIXED;
  else throw PyErrorOf(g_usage, "KV calibrate: mode must be 'rans' or 'fixed', not '" + mode + "'");
  p.fixed_bits = fixed_bits;
  p.no_checksum = checksum ? 0 : 1;
  if (row_dims.size() > TZ_KV_MAX_ROW_DIMS) throw PyErrorOf(g_usage, "KV calibrate: at most 4 row dims");
  p.n_row_dims = (unsigned)row_dims.size();
  for (size_t i = 0; i < row_dims.size(); ++i) p.row_dims[i] = row_dims[i];
  std::unique_ptr<tz::kv::Codec> c;
  size_t r;
  {
    nb::gil_scoped_release nogil;
    r = tz::kv::Codec::calibrate(&c, sample.data(), sample.size(), (uint8_t)dtype, p);
  }
  if (tz_is_error(r)) throw_kv(r, "KV calibrate");
  return PyKvCodec(std::move(c));
}

PyKvCodec kv_load(nb::handle blob_obj) {
  BufferView blob(blob_obj, false, "tables");
  std::unique_ptr<tz::kv::Codec> c;
  const size_t r = tz::kv::Codec::load(&c, blob.data(), blob.size());
  if (tz_is_error(r)) throw_kv(r, "KV tables");
  return PyKvCodec(std::move(c));
}

}  // namespace

void bind_kv(nb::module_& m) {
  auto cls = nb::class_<PyKvCodec>(m, "KvCodec", "Calibrated KV page codec (doc/kv.md); use tensorzip.kv.PageCodec.");
  cls.def("tables", &PyKvCodec::tables, "The serialised tables (a few hundred bytes).")
      .def("info", &PyKvCodec::info)
      .def("bound", &PyKvCodec::bound, "page_bytes"_a)
      .def("encode", &PyKvCodec::encode, "page"_a)
      .def("decoded_size", &PyKvCodec::decoded_size, "page"_a)
      .def("decode_into", &PyKvCodec::decode_into, "page"_a, "out"_a)
      .def("encode_batch", &PyKvCodec::encode_batch, "pages"_a, "page_bytes"_a, "threads"_a = 0u)
      .def("decode_batch", &PyKvCodec::decode_batch, "pages"_a, "out"_a, "page_bytes"_a, "threads"_a = 0u);
#ifdef TZ_PY_HAVE_KV_CUDA
  cls.def("cuda_upload_tables", &PyKvCodec::cuda_upload_tables, "tables_ptr"_a, "capacity"_a, "stream"_a)
      .def("cuda_encode_temp_size", &PyKvCodec::cuda_encode_temp_size, "page_bytes"_a, "n_pages"_a)
      .def("cuda_encode", &PyKvCodec::cuda_encode, "tables_ptr"_a, "src_ptr"_a, "page_bytes"_a, "n_pages"_a,
           "dst_ptr"_a, "dst_stride"_a, "temp_ptr"_a, "temp_size"_a, "sizes_ptr"_a, "status_ptr"_a, "stream"_a)
      .def("cuda_decode_temp_size", &PyKvCodec::cuda_decode_temp_size, "offsets"_a, "page_bytes"_a)
      .def("cuda_decode", &PyKvCodec::cuda_decode, "tables_ptr"_a, "src_ptr"_a, "offsets"_a, "dst_ptr"_a,
           "page_bytes"_a, "temp_ptr"_a, "temp_size"_a, "sizes_ptr"_a, "status_ptr"_a, "stream"_a);
  m.def("kv_cuda_tables_size", &tz_kv_cuda_tables_size, "Device bytes of one KV codec's tables.");
  // A per-page status of the CUDA kernels (a tz_error_code) raised as the CPU codec raises it.
  m.def("kv_cuda_raise_status", [](int status, const std::string& what) {
    if (status != 0) throw_kv((size_t) - (ptrdiff_t)(status > 0 ? status : (int)TZ_ERROR_GENERIC), what);
  }, "status"_a, "what"_a);
  m.attr("HAVE_KV_CUDA") = true;
#else
  m.attr("HAVE_KV_CUDA") = false;
#endif
  m.def("kv_calibrate", &kv_calibrate, "sample"_a, "dtype"_a, "mode"_a = "rans", "fixed_bits"_a = 0u,
        "checksum"_a = true, "row_dims"_a = std::vector<uint32_t>());
  m.def("kv_load", &kv_load, "tables"_a);
}

}  // namespace tz_py

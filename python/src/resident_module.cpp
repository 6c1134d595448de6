// Bindings of resident weights (tensorzip.resident): the prepared CPU decode
// plan (src/resident/plan.hpp), the CUDA plan where the
// module is built with CUDA, and raw frame access to .tzip files (frames
// kept compressed when a model is loaded straight into resident form).
//
// Pointers cross this boundary as integers (torch.Tensor.data_ptr()): the
// Python layer owns every buffer and keeps it alive while a plan refers to it.
#include <Python.h>
#include <fcntl.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "module_common.hpp"
#include "resident/plan.hpp"
#ifdef TZ_PY_HAVE_CUDA
#include "resident/plan_cuda.hpp"
#endif
#ifdef TZ_PY_HAVE_CONTAINER
#include <xxhash.h>

#include "tensorzip/container.hpp"
#endif

namespace tz_py {
using namespace nb::literals;

namespace {

template <class F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const tz::resident::ResidentFrameError& e) {
    throw PyErrorOf(g_corrupt, e.what());
  } catch (const tz::resident::ResidentDecodeError& e) {
    throw PyErrorOf(g_corrupt, e.what());
  } catch (const std::invalid_argument& e) {
    throw PyErrorOf(g_usage, e.what());
  } catch (const std::logic_error& e) {
    throw PyErrorOf(g_usage, e.what());
  }
}

void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }

class PyResidentPlan {
 public:
  PyResidentPlan(unsigned threads, uint64_t table_budget) : p_(threads, table_budget) {}
  uint64_t add(size_t group, const std::string& name, uintptr_t frame, size_t size, uint64_t dst_offset) {
    return translated([&] { return p_.add(group, name, as_ptr(frame), size, dst_offset); });
  }
  void finalize() {
    translated([&] { p_.finalize(); });
  }
  void decode(size_t group, uintptr_t dst, size_t capacity) {
    nb::gil_scoped_release nogil;
    translated([&] { p_.decode(group, as_ptr(dst), capacity); });
  }
  void start(size_t group, uintptr_t dst, size_t capacity) {
    nb::gil_scoped_release nogil;  // may wait for a previous background decode
    translated([&] { p_.start(group, as_ptr(dst), capacity); });
  }
  void wait() {
    nb::gil_scoped_release nogil;
    translated([&] { p_.wait(); });
  }
  uint64_t decode_blocks(size_t group, size_t frame, uint32_t first, uint32_t count, uintptr_t dst, size_t capacity) {
    nb::gil_scoped_release nogil;
    return translated([&] { return p_.decode_blocks(group, frame, first, count, as_ptr(dst), capacity); });
  }
  bool busy() { return p_.busy(); }
  tz::resident::ResidentPlan& plan() { return p_; }

 private:
  tz::resident::ResidentPlan p_;
};

#ifdef TZ_PY_HAVE_CUDA
class PyResidentPlanCuda {
 public:
  void add(size_t group, const std::string& name, uintptr_t frame, size_t size, uint64_t raw_size,
           uint64_t dst_offset) {
    translated([&] { p_.add(group, name, as_ptr(frame), size, raw_size, dst_offset); });
  }
  void finalize() {
    translated([&] { p_.finalize(); });
  }
  void decode(size_t group, uintptr_t dst, size_t capacity, uintptr_t temp, size_t temp_size, uintptr_t sizes,
              uintptr_t status, uintptr_t stream) {
    size_t r;
    {
      nb::gil_scoped_release nogil;
      r = translated([&] {
        return p_.decode(group, as_ptr(dst), capacity, as_ptr(temp), temp_size, static_cast<size_t*>(as_ptr(sizes)),
                         static_cast<int*>(as_ptr(status)), reinterpret_cast<cudaStream_t>(stream));
      });
    }
    if (tz_is_error(r))
      throw PyErrorOf(g_usage, std::string("resident weights: CUDA decode of group ") + std::to_string(group) +
                                   " could not start: " + tz_get_error_name(r));
  }
  tz::resident::ResidentPlanCuda& plan() { return p_; }

 private:
  tz::resident::ResidentPlanCuda p_;
};
#endif

#ifdef TZ_PY_HAVE_CONTAINER
namespace tc = tz::container;

// The frames of every tensor of a .tzip file, as the container's Reader
// validated them: [(name, dtype, shape, predicted, [(offset, size, raw_size, xxh64)])].
nb::list tzip_frame_table(const std::string& path) {
  std::vector<tc::TensorEntry> entries;
  {
    nb::gil_scoped_release nogil;
    try {
      tc::Reader r(path, 1);
      entries = r.tensors();
    } catch (const tc::Error& e) {
      throw PyErrorOf(e.kind() == tc::ErrorKind::kIO ? g_io : g_corrupt, e.what());
    }
  }
  nb::list out;
  for (const auto& t : entries) {
    nb::list shape, frames;
    for (uint64_t s : t.shape) shape.append(s);
    for (const auto& f : t.frames) frames.append(nb::make_tuple(f.offset, f.size, f.raw_size, f.xxh64));
    out.append(nb::make_tuple(t.name, t.dtype, nb::tuple(shape), t.predict.kind != tc::PredictKind::kNone, frames));
  }
  return out;
}

// Reads frames of a .tzip file into out (a writable buffer): each
// (file_offset, size, xxh64, out_offset) is read with pread and checked
// against its xxh64 (recorded in the file's header), without decoding.
void read_frames_into(const std::string& path, const std::vector<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>>& frames,
                      uintptr_t out, size_t out_size) {
  nb::gil_scoped_release nogil;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw PyErrorOf(g_io, path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  std::string err;
  PyObject* err_type = g_corrupt;
  uint8_t* dst = static_cast<uint8_t*>(as_ptr(out));
  for (const auto& [off, size, xxh, out_off] : frames) {
    if (!stat_ok || off > (uint64_t)st.st_size || size > (uint64_t)st.st_size - off) {
      err = path + ": frame at offset " + std::to_string(off) + " (" + std::to_string(size) + " bytes) is past the end of the file";
      break;
    }
    if (out_off > out_size || size > out_size - out_off) {
      err = path + ": frame does not fit its destination";
      err_type = g_usage;
      break;
    }
    uint64_t done = 0;
    while (done < size) {
      const ssize_t r = ::pread(fd, dst + out_off + done, size - done, (off_t)(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        err = path + ": read failed at offset " + std::to_string(off + done) + ": " +
              (r < 0 ? std::strerror(errno) : "unexpected end of file");
        err_type = g_io;
        break;
      }
      done += (uint64_t)r;
    }
    if (!err.empty()) break;
    if (XXH64(dst + out_off, size, 0) != xxh) {
      err = path + ": frame at offset " + std::to_string(off) + " does not match its checksum (corrupt file)";
      break;
    }
  }
  ::close(fd);
  if (!err.empty()) throw PyErrorOf(err_type, err);
}
#endif

}  // namespace

void bind_resident(nb::module_& m) {
  nb::class_<PyResidentPlan>(m, "ResidentPlan",
                             "Prepared CPU decode plan of resident weights (tensorzip.resident); pointers are ints.")
      .def(nb::init<unsigned, uint64_t>(), "threads"_a = 0u,
           "table_budget"_a = tz::resident::ResidentPlan::kDefaultTableBudget)
      .def("add", &PyResidentPlan::add, "group"_a, "name"_a, "frame_ptr"_a, "frame_size"_a, "dst_offset"_a)
      .def("finalize", &PyResidentPlan::finalize)
      .def("decode", &PyResidentPlan::decode, "group"_a, "dst_ptr"_a, "capacity"_a)
      .def("start", &PyResidentPlan::start, "group"_a, "dst_ptr"_a, "capacity"_a)
      .def("wait", &PyResidentPlan::wait)
      .def("decode_blocks", &PyResidentPlan::decode_blocks, "group"_a, "frame"_a, "first"_a, "count"_a, "dst_ptr"_a,
           "capacity"_a)
      .def("busy", &PyResidentPlan::busy)
      .def_prop_ro("threads", [](PyResidentPlan& p) { return p.plan().threads(); })
      .def_prop_ro("groups", [](PyResidentPlan& p) { return p.plan().groups(); })
      .def("group_bytes", [](PyResidentPlan& p, size_t g) { return p.plan().group_bytes(g); }, "group"_a)
      .def("frames", [](PyResidentPlan& p, size_t g) { return p.plan().frames(g); }, "group"_a)
      .def("tasks", [](PyResidentPlan& p, size_t g) { return p.plan().tasks(g); }, "group"_a)
      .def_prop_ro("prepared_frames", [](PyResidentPlan& p) { return p.plan().prepared_frames(); })
      .def_prop_ro("prepared_bytes", [](PyResidentPlan& p) { return p.plan().prepared_bytes(); })
      .def_prop_ro("table_budget", [](PyResidentPlan& p) { return p.plan().table_budget(); })
      .def_prop_ro("decoded_bytes", [](PyResidentPlan& p) { return p.plan().decoded_bytes(); })
      .def_prop_ro("decode_seconds", [](PyResidentPlan& p) { return p.plan().decode_seconds(); });

#ifdef TZ_PY_HAVE_CUDA
  nb::class_<PyResidentPlanCuda>(m, "ResidentPlanCuda",
                                 "Prepared CUDA decode plan of resident weights (frames in device memory).")
      .def(nb::init<>())
      .def("add", &PyResidentPlanCuda::add, "group"_a, "name"_a, "frame_ptr"_a, "frame_size"_a, "raw_size"_a,
           "dst_offset"_a)
      .def("finalize", &PyResidentPlanCuda::finalize)
      .def("decode", &PyResidentPlanCuda::decode, "group"_a, "dst_ptr"_a, "capacity"_a, "temp_ptr"_a,
           "temp_size"_a, "sizes_ptr"_a, "status_ptr"_a, "stream"_a)
      .def_prop_ro("groups", [](PyResidentPlanCuda& p) { return p.plan().groups(); })
      .def_prop_ro("temp_bytes", [](PyResidentPlanCuda& p) { return p.plan().temp_bytes(); })
      .def_prop_ro("max_frames", [](PyResidentPlanCuda& p) { return p.plan().max_frames(); })
      .def("group_bytes", [](PyResidentPlanCuda& p, size_t g) { return p.plan().group_bytes(g); }, "group"_a)
      .def("frames", [](PyResidentPlanCuda& p, size_t g) { return p.plan().frames(g); }, "group"_a)
      .def("name", [](PyResidentPlanCuda& p, size_t g, size_t i) { return p.plan().name(g, i); }, "group"_a,
           "item"_a);
  m.attr("HAVE_RESIDENT_CUDA") = true;
#else
  m.attr("HAVE_RESIDENT_CUDA") = false;
#endif

#ifdef TZ_PY_HAVE_CONTAINER
  m.def("tzip_frame_table", &tzip_frame_table, "path"_a);
  m.def("read_frames_into", &read_frames_into, "path"_a, "frames"_a, "out_ptr"_a, "out_size"_a);
#endif
}

}  // namespace tz_py

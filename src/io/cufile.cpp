#include "cufile.hpp"

#include <dlfcn.h>
#include <errno.h>

#include <mutex>
#include <stdexcept>

namespace tz::io {

namespace {

// The part of the cuFile ABI used here (cufile.h of the GDS SDK, CUDA 11.4+).
struct CuFileError {
  int err;     // CUfileOpError, 0 = CU_FILE_SUCCESS
  int cu_err;  // CUresult
};
struct CuFileDescr {
  int type;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};
using DriverOpenFn = CuFileError (*)();
using DriverCloseFn = CuFileError (*)();
using HandleRegisterFn = CuFileError (*)(void**, CuFileDescr*);
using HandleDeregisterFn = void (*)(void*);
using BufRegisterFn = CuFileError (*)(const void*, size_t, int);
using BufDeregisterFn = CuFileError (*)(const void*);
using ReadFn = ssize_t (*)(void*, void*, size_t, off_t, off_t);
using WriteFn = ssize_t (*)(void*, const void*, size_t, off_t, off_t);

struct Api {
  void* lib = nullptr;
  bool driver_open = false;
  DriverOpenFn driver_open_fn = nullptr;
  DriverCloseFn driver_close = nullptr;
  HandleRegisterFn handle_register = nullptr;
  HandleDeregisterFn handle_deregister = nullptr;
  BufRegisterFn buf_register = nullptr;
  BufDeregisterFn buf_deregister = nullptr;
  ReadFn read = nullptr;
  WriteFn write = nullptr;
  ~Api() {
    if (driver_open && driver_close) driver_close();
    // The library stays loaded: cuFile keeps threads that outlive a dlclose.
  }
};

std::mutex g_mu;
Api g_api;

template <class F>
bool sym(void* lib, F* out, const char* name, const char* alt = nullptr) {
  void* p = dlsym(lib, name);
  if (!p && alt) p = dlsym(lib, alt);
  *out = reinterpret_cast<F>(p);
  return p != nullptr;
}

}  // namespace

GdsDecision decide_gds(bool wanted, int gpus, const char* lib) {
  GdsDecision d;
  if (!wanted) {
    d.reason = "not requested";
    return d;
  }
  if (gpus <= 0) {
    d.reason = "no CUDA device";
    return d;
  }
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_api.driver_open) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      d.reason = std::string(lib) + " not loadable" + (e ? std::string(": ") + e : std::string());
      return d;
    }
    Api a;
    a.lib = h;
    const bool ok = sym(h, &a.driver_open_fn, "cuFileDriverOpen") &&
                    sym(h, &a.driver_close, "cuFileDriverClose_v2", "cuFileDriverClose") &&
                    sym(h, &a.handle_register, "cuFileHandleRegister") &&
                    sym(h, &a.handle_deregister, "cuFileHandleDeregister") &&
                    sym(h, &a.buf_register, "cuFileBufRegister") && sym(h, &a.buf_deregister, "cuFileBufDeregister") &&
                    sym(h, &a.read, "cuFileRead") && sym(h, &a.write, "cuFileWrite");
    if (!ok) {
      dlclose(h);
      d.reason = std::string(lib) + " lacks cuFile symbols";
      return d;
    }
    const CuFileError e = a.driver_open_fn();
    if (e.err != 0) {
      dlclose(h);
      d.reason = "cuFileDriverOpen failed (error " + std::to_string(e.err) + ")";
      return d;
    }
    a.driver_open = true;
    g_api = a;
    a.driver_open = false;  // owned by g_api now
  }
  d.use = true;
  d.reason = "cuFile driver open";
  return d;
}

GdsFile::GdsFile(int fd) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_api.driver_open) throw std::runtime_error("cuFile is not available");
  CuFileDescr desc{};
  desc.type = 1;
  desc.handle.fd = fd;
  const CuFileError e = g_api.handle_register(&handle_, &desc);
  if (e.err != 0) throw std::runtime_error("cuFileHandleRegister failed (error " + std::to_string(e.err) + ")");
}

GdsFile::~GdsFile() {
  if (handle_ && g_api.handle_deregister) g_api.handle_deregister(handle_);
}

int GdsFile::read(void* dev, size_t n, uint64_t off) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = g_api.read(handle_, dev, n - done, (off_t)(off + done), (off_t)done);
    if (r < 0) return r == -1 ? errno : EIO;  // -1: errno set; other negatives: cuFile error codes
    if (r == 0) return EIO;
    done += (size_t)r;
  }
  return 0;
}

int GdsFile::write(const void* dev, size_t n, uint64_t off) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = g_api.write(handle_, dev, n - done, (off_t)(off + done), (off_t)done);
    if (r < 0) return r == -1 ? errno : EIO;
    if (r == 0) return ENOSPC;
    done += (size_t)r;
  }
  return 0;
}

bool gds_register_buffer(const void* dev, size_t n) {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_api.driver_open && g_api.buf_register(dev, n, 0).err == 0;
}

void gds_deregister_buffer(const void* dev) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_api.driver_open) g_api.buf_deregister(dev);
}

}  // namespace tz::io

// C functions of include/tensorzip/tzip_file.h: exceptions stop here and
// become a status plus a thread-local message. Built into the container
// library (tensorzip_container, src/container/CMakeLists.txt).
#include <new>
#include <string>

#include "tensorzip/container.hpp"
#include "tensorzip/tzip_file.h"

namespace tc = tz::container;

struct tzip_reader_s {
  explicit tzip_reader_s(const char* path, unsigned threads) : r(path, threads) {}
  tc::Reader r;
};

namespace {
thread_local std::string g_error;

template <class F>
int guarded(F&& f) {
  try {
    g_error.clear();
    f();
    return TZIP_OK;
  } catch (const tc::Error& e) {
    g_error = e.what();
    return (int)e.kind();
  } catch (const std::bad_alloc&) {
    g_error = "out of memory";
    return TZIP_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    g_error = std::string("internal error: ") + e.what();
    return TZIP_ERROR_INTERNAL;
  } catch (...) {
    g_error = "internal error";
    return TZIP_ERROR_INTERNAL;
  }
}

bool valid(const tzip_reader* r, size_t i) { return r && i < r->r.tensors().size(); }
}  // namespace

extern "C" {

const char* tzip_last_error(void) { return g_error.c_str(); }

int tzip_compress_file(const char* in, const char* out, int level, unsigned threads, int force) {
  return guarded([&] {
    if (!in || !out) throw tc::Error(tc::ErrorKind::kUsage, "null path");
    tc::WriteOptions o;
    o.level = level;
    o.threads = threads;
    o.force = force != 0;
    tc::compress_file(in, out, o);
  });
}

int tzip_decompress_file(const char* in, const char* out, unsigned threads, int force) {
  return guarded([&] {
    if (!in || !out) throw tc::Error(tc::ErrorKind::kUsage, "null path");
    tc::ReadOptions o;
    o.threads = threads;
    o.force = force != 0;
    tc::Reader(in, threads).export_safetensors(out, o);
  });
}

int tzip_verify_file(const char* path, const char* original, unsigned threads) {
  return guarded([&] {
    if (!path) throw tc::Error(tc::ErrorKind::kUsage, "null path");
    tc::ReadOptions o;
    o.threads = threads;
    tc::Reader(path, threads).verify(original ? original : "", o);
  });
}

tzip_reader* tzip_open(const char* path, unsigned threads) {
  tzip_reader* r = nullptr;
  guarded([&] {
    if (!path) throw tc::Error(tc::ErrorKind::kUsage, "null path");
    r = new tzip_reader_s(path, threads);
  });
  return r;
}

void tzip_close(tzip_reader* r) { delete r; }

size_t tzip_tensor_count(const tzip_reader* r) { return r ? r->r.tensors().size() : 0; }

long tzip_find(const tzip_reader* r, const char* name) { return r && name ? r->r.find(name) : -1; }

const char* tzip_tensor_name(const tzip_reader* r, size_t i) {
  return valid(r, i) ? r->r.tensors()[i].name.c_str() : nullptr;
}

const char* tzip_tensor_dtype(const tzip_reader* r, size_t i) {
  return valid(r, i) ? r->r.tensors()[i].dtype.c_str() : nullptr;
}

uint64_t tzip_tensor_size(const tzip_reader* r, size_t i) { return valid(r, i) ? r->r.tensors()[i].raw_size() : 0; }

size_t tzip_tensor_shape(const tzip_reader* r, size_t i, uint64_t* dims, size_t max_dims) {
  if (!valid(r, i)) return 0;
  const auto& s = r->r.tensors()[i].shape;
  for (size_t k = 0; k < s.size() && k < max_dims && dims; ++k) dims[k] = s[k];
  return s.size();
}

int tzip_read_tensor(tzip_reader* r, size_t i, void* dst, size_t capacity) {
  return guarded([&] {
    if (!r) throw tc::Error(tc::ErrorKind::kUsage, "null reader");
    r->r.read_tensor(i, dst, capacity);
  });
}

int tzip_read_range(tzip_reader* r, size_t i, uint64_t offset, uint64_t size, void* dst) {
  return guarded([&] {
    if (!r) throw tc::Error(tc::ErrorKind::kUsage, "null reader");
    r->r.read_range(i, offset, size, dst);
  });
}

}  // extern "C"

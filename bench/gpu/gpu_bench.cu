// GPU benchmark: tensorzip CUDA backend vs nvCOMP (ANS, zstd) on real
// checkpoint tensors tiled to >= 4 GB per data kind, plus device-to-device
// memcpy bandwidth and a 1 MiB single-tensor latency row. One table.
// Run through bench/gpu/run.sh (which says how to fill .device-data/).
//
//   tz_gpu_bench [--data DIR]... [--bytes N] [--runs R] [--list]
//
// Times are CUDA-event medians of R runs after one warm-up; GB/s counts
// uncompressed bytes (1 GB = 1e9 B) for both directions.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tensorzip/tensorzip.h"
#include "tensorzip/tensorzip_cuda.h"

#ifdef TZ_HAVE_NVCOMP
#include <nvcomp/ans.h>
#include <nvcomp/zstd.h>
#endif

namespace {

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

using Bytes = std::vector<uint8_t>;

struct Tensor {
  std::string name, dtype;
  Bytes data;
};

// Minimal safetensors reader: 8-byte header length, JSON header, data. Only
// "dtype" and "data_offsets" of each entry are needed; the JSON written by
// safetensors has no nesting beyond shape lists, so a scan suffices here.
std::vector<Tensor> read_safetensors(const std::string& path) {
  std::vector<Tensor> out;
  std::ifstream f(path, std::ios::binary);
  if (!f) return out;
  uint64_t hl = 0;
  f.read((char*)&hl, 8);
  if (!f || hl > (1u << 26)) return out;
  std::string js(hl, '\0');
  f.read(js.data(), (std::streamsize)hl);
  const uint64_t data_start = 8 + hl;
  size_t pos = 0;
  while (true) {
    const size_t d = js.find("\"dtype\"", pos);
    if (d == std::string::npos) break;
    // The entry's key: the last quoted string before the '{' that opens it.
    const size_t brace = js.rfind('{', d);
    const size_t key_end = brace == std::string::npos ? std::string::npos : js.rfind('"', brace);
    const size_t key_beg = key_end == std::string::npos || key_end == 0 ? std::string::npos : js.rfind('"', key_end - 1);
    const size_t q1 = js.find('"', d + 7);
    const size_t q2 = js.find('"', q1 + 1);
    const size_t o = js.find("\"data_offsets\"", d);
    if (q1 == std::string::npos || q2 == std::string::npos || o == std::string::npos) break;
    const size_t lb = js.find('[', o);
    Tensor t;
    if (key_beg != std::string::npos) t.name = js.substr(key_beg + 1, key_end - key_beg - 1);
    t.dtype = js.substr(q1 + 1, q2 - q1 - 1);
    unsigned long long a = 0, b = 0;
    if (lb == std::string::npos || sscanf(js.c_str() + lb, "[ %llu , %llu ]", &a, &b) != 2 || b < a) break;
    t.data.resize(b - a);
    f.seekg((std::streamoff)(data_start + a));
    f.read((char*)t.data.data(), (std::streamsize)(b - a));
    if (f) out.push_back(std::move(t));
    f.clear();
    pos = o + 1;
  }
  return out;
}

struct Dataset {
  std::string kind;
  tz_dtype dtype;
  Bytes base;  // concatenated real tensors
};

// The .safetensors files directly in dir, sorted (none if it cannot be read).
std::vector<std::string> list_safetensors(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  if (!d) return files;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 12 && n.substr(n.size() - 12) == ".safetensors") files.push_back(dir + "/" + n);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<Dataset> load_datasets(const std::vector<std::string>& dirs) {
  std::map<std::string, Dataset> m;
  for (const auto& dir : dirs) {
    for (const auto& file : list_safetensors(dir)) {
      for (auto& t : read_safetensors(file)) {
        std::string kind;
        tz_dtype dt;
        if (t.dtype == "BF16") {
          kind = "bf16-weights", dt = TZ_DTYPE_BF16;
        } else if (t.dtype == "F32") {
          dt = TZ_DTYPE_F32;
          if (t.name.rfind("exp_avg_sq", 0) == 0) kind = "adam-v";
          else if (t.name.rfind("exp_avg", 0) == 0) kind = "adam-m";
          else if (t.name.rfind("master", 0) == 0) kind = "fp32-master";
          else kind = "fp32-other";
        } else {
          continue;
        }
        Dataset& ds = m[kind];
        ds.kind = kind;
        ds.dtype = dt;
        ds.base.insert(ds.base.end(), t.data.begin(), t.data.end());
      }
    }
    if (!m.empty()) break;  // first directory with data wins
  }
  std::vector<Dataset> v;
  for (auto& [k, ds] : m) v.push_back(std::move(ds));
  return v;
}

template <class F>
double median_ms(int runs, cudaStream_t s, F&& f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, s));
  f();  // warm-up
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float warm = 0;
  CK(cudaEventElapsedTime(&warm, a, b));
  if (warm > 1500.0f) runs = std::min(runs, 3);  // keep a slow case inside the session's time
  std::vector<float> t;
  for (int r = 0; r < runs; ++r) {
    CK(cudaEventRecord(a, s));
    f();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

__global__ void count_diff(const uint8_t* a, const uint8_t* b, size_t n, unsigned long long* diff) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(diff, local);
}

unsigned long long device_diff(const uint8_t* a, const uint8_t* b, size_t n) {
  unsigned long long* d;
  CK(cudaMalloc(&d, 8));
  CK(cudaMemset(d, 0, 8));
  count_diff<<<4096, 256>>>(a, b, n, d);
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, d, 8, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return h;
}

struct Row {
  std::string name;
  double gb = 0, ratio = 0, enc = 0, dec = 0;
  std::string note;
};

void print_row(const Row& r) {
  printf("  %-28s ratio %.3f  compress %.1f GB/s  decompress %.1f GB/s  %s\n", r.name.c_str(), r.ratio, r.enc, r.dec,
         r.note.c_str());
  fflush(stdout);
}

double gbps(size_t bytes, double ms) { return ms > 0 ? bytes / (ms * 1e6) : 0; }

struct TzRun {
  double ratio = 0, enc_ms = 0, dec_ms = 0;
  bool ok = true, identical = false;
  std::string note;
};

// Compresses and decompresses n_items items of item_bytes each, laid out
// back to back at d_src, with the batch API. With pred_kind (issue 6:
// checkpoint-aware coding), item i is coded against the prediction at
// d_pred + i * pred_item_bytes, fused into the kernels on both sides; the
// frames then hold residuals, so the CPU comparison is left to the GPU test
// (CudaGpu.PredictedCastAndDelta) and only the exact round trip is checked.
TzRun run_tz(const uint8_t* d_src, size_t item_bytes, size_t n_items, tz_dtype dt, const Bytes& host_item, int runs,
             cudaStream_t s, int pred_kind = TZ_CUDA_PREDICT_NONE, const uint8_t* d_pred = nullptr,
             size_t pred_item_bytes = 0) {
  TzRun r;
  const size_t bound = tz_compress_bound(item_bytes);
  uint8_t *d_frames, *d_out;
  CK(cudaMalloc(&d_frames, bound * n_items));
  CK(cudaMalloc(&d_out, item_bytes * n_items));
  auto prediction = [&](size_t i) {
    tz_cuda_prediction pr{};
    if (pred_kind != TZ_CUDA_PREDICT_NONE) pr = {pred_kind, d_pred + i * pred_item_bytes, pred_item_bytes};
    return pr;
  };
  std::vector<tz_cuda_compress_item> ci(n_items);
  for (size_t i = 0; i < n_items; ++i)
    ci[i] = {d_src + i * item_bytes, item_bytes, dt, d_frames + i * bound, bound, prediction(i)};
  tz_params p{};
  const size_t ctb = tz_cuda_compress_temp_size(ci.data(), n_items, &p);
  void* ctemp;
  CK(cudaMalloc(&ctemp, ctb));
  size_t* d_sizes;
  int* d_status;
  CK(cudaMalloc(&d_sizes, n_items * sizeof(size_t)));
  CK(cudaMalloc(&d_status, n_items * sizeof(int)));
  r.enc_ms = median_ms(runs, s, [&] {
    const size_t e = tz_cuda_compress(ci.data(), n_items, &p, ctemp, ctb, d_sizes, d_status, s);
    if (e) r.ok = false;
  });
  std::vector<size_t> sizes(n_items);
  std::vector<int> st(n_items);
  CK(cudaMemcpy(sizes.data(), d_sizes, n_items * sizeof(size_t), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(st.data(), d_status, n_items * sizeof(int), cudaMemcpyDeviceToHost));
  size_t total = 0;
  for (size_t i = 0; i < n_items; ++i) {
    if (st[i] != 0) r.ok = false;
    total += sizes[i];
  }
  r.ratio = total ? (double)item_bytes * n_items / total : 0;
  // Byte identity with the CPU encoder on the first item.
  if (pred_kind == TZ_CUDA_PREDICT_NONE) {
    Bytes cpu(tz_compress_bound(item_bytes)), gpu(sizes[0]);
    tz_params cp{};
    cp.dtype = dt;
    const size_t cs = tz_compress(cpu.data(), cpu.size(), host_item.data(), host_item.size(), &cp);
    CK(cudaMemcpy(gpu.data(), d_frames, sizes[0], cudaMemcpyDeviceToHost));
    r.identical = !tz_is_error(cs) && cs == sizes[0] && memcmp(cpu.data(), gpu.data(), cs) == 0;
    // And the CPU decodes the GPU frame.
    Bytes back(item_bytes);
    if (tz_decompress(back.data(), back.size(), gpu.data(), gpu.size(), 0) != item_bytes || back != host_item)
      r.ok = false, r.note += " CPU-decode-of-GPU-frame FAILED";
  }
  std::vector<tz_cuda_decompress_item> di(n_items);
  for (size_t i = 0; i < n_items; ++i)
    di[i] = {d_frames + i * bound, sizes[i], d_out + i * item_bytes, item_bytes, prediction(i)};
  const size_t dtb = tz_cuda_decompress_temp_size(di.data(), n_items);
  void* dtemp;
  CK(cudaMalloc(&dtemp, dtb));
  r.dec_ms = median_ms(runs, s, [&] {
    const size_t e = tz_cuda_decompress(di.data(), n_items, dtemp, dtb, d_sizes, d_status, s);
    if (e) r.ok = false;
  });
  CK(cudaMemcpy(st.data(), d_status, n_items * sizeof(int), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n_items; ++i)
    if (st[i] != 0) r.ok = false, r.note += " decode-status=" + std::to_string(st[i]);
  if (device_diff(d_src, d_out, item_bytes * n_items) != 0) r.ok = false, r.note += " MISMATCH";
  if (!r.ok && r.note.empty()) r.note = " FAILED";
  CK(cudaFree(ctemp));
  CK(cudaFree(dtemp));
  CK(cudaFree(d_frames));
  CK(cudaFree(d_out));
  CK(cudaFree(d_sizes));
  CK(cudaFree(d_status));
  return r;
}

#ifdef TZ_HAVE_NVCOMP
__global__ void chunk_ptrs(uint8_t* base, size_t stride, void** ptrs, size_t n) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) ptrs[i] = base + i * stride;
}
__global__ void chunk_bytes(size_t total, size_t chunk, size_t* bytes, size_t n) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) bytes[i] = min(chunk, total - i * chunk);
}

// nvCOMP batched ANS (algo 0) or zstd (algo 1) on 64 KiB chunks of d_src.
TzRun run_nvcomp(int algo, const uint8_t* d_src, size_t total, tz_dtype dt, int runs, cudaStream_t s) {
  TzRun r;
  const size_t chunk = 1 << 16;
  const size_t n = (total + chunk - 1) / chunk;
  nvcompBatchedANSCompressOpts_t aopt = nvcompBatchedANSCompressDefaultOpts;
  aopt.data_type = dt == TZ_DTYPE_F32 ? NVCOMP_TYPE_FLOAT32 : dt == TZ_DTYPE_BF16 ? NVCOMP_TYPE_FLOAT16
                                                                                  : NVCOMP_TYPE_UCHAR;
  const nvcompBatchedZstdCompressOpts_t zopt = nvcompBatchedZstdCompressDefaultOpts;
  size_t max_out = 0, ctemp_b = 0, dtemp_b = 0;
  nvcompStatus_t st;
  if (algo == 0) {
    st = nvcompBatchedANSCompressGetMaxOutputChunkSize(chunk, aopt, &max_out);
    if (st == nvcompSuccess) st = nvcompBatchedANSCompressGetTempSize(n, chunk, aopt, &ctemp_b, total, s);
    if (st == nvcompSuccess)
      st = nvcompBatchedANSDecompressGetTempSize(n, chunk, nvcompBatchedANSDecompressDefaultOpts, &dtemp_b, total, s);
  } else {
    st = nvcompBatchedZstdCompressGetMaxOutputChunkSize(chunk, zopt, &max_out);
    if (st == nvcompSuccess) st = nvcompBatchedZstdCompressGetTempSize(n, chunk, zopt, &ctemp_b, total, s);
    if (st == nvcompSuccess)
      st = nvcompBatchedZstdDecompressGetTempSize(n, chunk, nvcompBatchedZstdDecompressDefaultOpts, &dtemp_b, total,
                                                  s);
  }
  if (st != nvcompSuccess) {
    r.ok = false;
    r.note = " nvcomp setup status " + std::to_string((int)st);
    return r;
  }
  max_out = (max_out + 255) & ~(size_t)255;  // chunk outputs 256-aligned (above any nvCOMP requirement)
  const void** d_in_ptrs;
  size_t *d_in_bytes, *d_c_bytes, *d_out_bytes;
  void** d_c_ptrs;
  void** d_o_ptrs;
  uint8_t *d_c, *d_o;
  void *ctemp, *dtemp;
  nvcompStatus_t* d_st;
  CK(cudaMalloc(&d_in_ptrs, n * 8));
  CK(cudaMalloc(&d_in_bytes, n * 8));
  CK(cudaMalloc(&d_c_bytes, n * 8));
  CK(cudaMalloc(&d_out_bytes, n * 8));
  CK(cudaMalloc(&d_c_ptrs, n * 8));
  CK(cudaMalloc(&d_o_ptrs, n * 8));
  CK(cudaMalloc(&d_st, n * sizeof(nvcompStatus_t)));
  CK(cudaMalloc(&d_c, n * max_out));
  CK(cudaMalloc(&d_o, n * chunk));
  CK(cudaMalloc(&ctemp, std::max<size_t>(ctemp_b, 1)));
  CK(cudaMalloc(&dtemp, std::max<size_t>(dtemp_b, 1)));
  const unsigned g = (unsigned)((n + 255) / 256);
  chunk_ptrs<<<g, 256, 0, s>>>((uint8_t*)d_src, chunk, (void**)d_in_ptrs, n);
  chunk_ptrs<<<g, 256, 0, s>>>(d_c, max_out, d_c_ptrs, n);
  chunk_ptrs<<<g, 256, 0, s>>>(d_o, chunk, d_o_ptrs, n);
  chunk_bytes<<<g, 256, 0, s>>>(total, chunk, d_in_bytes, n);
  r.enc_ms = median_ms(runs, s, [&] {
    const nvcompStatus_t e =
        algo == 0 ? nvcompBatchedANSCompressAsync(d_in_ptrs, d_in_bytes, chunk, n, ctemp, ctemp_b, d_c_ptrs, d_c_bytes,
                                                  aopt, d_st, s)
                  : nvcompBatchedZstdCompressAsync(d_in_ptrs, d_in_bytes, chunk, n, ctemp, ctemp_b, d_c_ptrs,
                                                   d_c_bytes, zopt, d_st, s);
    if (e != nvcompSuccess) r.ok = false;
  });
  std::vector<size_t> cb(n);
  CK(cudaMemcpy(cb.data(), d_c_bytes, n * 8, cudaMemcpyDeviceToHost));
  size_t ctot = 0;
  for (size_t c : cb) ctot += c;
  r.ratio = ctot ? (double)total / ctot : 0;
  r.dec_ms = median_ms(runs, s, [&] {
    const nvcompStatus_t e =
        algo == 0 ? nvcompBatchedANSDecompressAsync((const void* const*)d_c_ptrs, d_c_bytes, d_in_bytes, d_out_bytes,
                                                    n, dtemp, dtemp_b, d_o_ptrs,
                                                    nvcompBatchedANSDecompressDefaultOpts, d_st, s)
                  : nvcompBatchedZstdDecompressAsync((const void* const*)d_c_ptrs, d_c_bytes, d_in_bytes, d_out_bytes,
                                                     n, dtemp, dtemp_b, d_o_ptrs,
                                                     nvcompBatchedZstdDecompressDefaultOpts, d_st, s);
    if (e != nvcompSuccess) r.ok = false;
  });
  if (device_diff(d_src, d_o, total) != 0) r.ok = false, r.note += " MISMATCH";
  for (void* p : {(void*)d_in_ptrs, (void*)d_in_bytes, (void*)d_c_bytes, (void*)d_out_bytes, (void*)d_c_ptrs,
                  (void*)d_o_ptrs, (void*)d_st, (void*)d_c, (void*)d_o, ctemp, dtemp})
    CK(cudaFree(p));
  return r;
}
#endif

// Checkpoint-aware coding rows (issue 6): values and their predictions.
//  - delta: the step-400 FP32 master weights against the same tensors at
//    step 200 (DIR/step200/, written by make_device_data.py);
//  - cast: the step-400 BF16 weights against their FP32 master weights
//    (round-to-nearest-even), the tensors of the slice that have both.
struct Pairing {
  const char* name;
  int kind;
  tz_dtype dt;
  Bytes values, pred;
};

std::vector<Pairing> build_pairings(const std::vector<std::string>& dirs) {
  std::map<std::string, const Tensor*> cur;
  std::vector<Tensor> all, prev;
  for (const auto& dir : dirs) {
    for (const auto& f : list_safetensors(dir))
      for (auto& t : read_safetensors(f)) all.push_back(std::move(t));
    if (!all.empty()) {
      prev = read_safetensors(dir + "/step200/step200-optim-master-slice.safetensors");
      break;
    }
  }
  for (const auto& t : all) cur[t.name] = &t;
  std::vector<Pairing> pairings(2);
  pairings[0] = {"delta fp32-master vs step 200", TZ_CUDA_PREDICT_DELTA, TZ_DTYPE_F32, {}, {}};
  pairings[1] = {"cast bf16-weights from fp32-master", TZ_CUDA_PREDICT_CAST, TZ_DTYPE_BF16, {}, {}};
  for (const auto& t : prev) {
    auto it = cur.find(t.name);
    if (t.dtype != "F32" || it == cur.end() || it->second->dtype != "F32" || it->second->data.size() != t.data.size())
      continue;
    pairings[0].values.insert(pairings[0].values.end(), it->second->data.begin(), it->second->data.end());
    pairings[0].pred.insert(pairings[0].pred.end(), t.data.begin(), t.data.end());
  }
  for (const auto& t : all) {
    auto it = cur.find("master." + t.name);
    if (t.dtype != "BF16" || it == cur.end() || it->second->dtype != "F32" ||
        it->second->data.size() != 2 * t.data.size())
      continue;
    pairings[1].values.insert(pairings[1].values.end(), t.data.begin(), t.data.end());
    pairings[1].pred.insert(pairings[1].pred.end(), it->second->data.begin(), it->second->data.end());
  }
  return pairings;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dirs;
  size_t target = 4ull << 30;
  int runs = 7;
  bool list_only = false;  // print the data kinds found and exit (no GPU needed)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--data" && i + 1 < argc) dirs.push_back(argv[++i]);
    else if (a == "--bytes" && i + 1 < argc) target = strtoull(argv[++i], nullptr, 10);
    else if (a == "--runs" && i + 1 < argc) runs = atoi(argv[++i]);
    else if (a == "--list") list_only = true;
    else {
      fprintf(stderr, "usage: %s [--data DIR]... [--bytes N] [--runs R] [--list]\n", argv[0]);
      return 2;
    }
  }
  if (dirs.empty()) dirs.push_back(".device-data");
  if (list_only) {
    for (const auto& ds : load_datasets(dirs))
      printf("%s: dtype %d, %.2f MiB of real data\n", ds.kind.c_str(), (int)ds.dtype, ds.base.size() / 1048576.0);
    for (const auto& pg : build_pairings(dirs))
      printf("%s: %.2f MiB of values, %.2f MiB of predictions\n", pg.name, pg.values.size() / 1048576.0,
             pg.pred.size() / 1048576.0);
    return 0;
  }
  int dev = 0;
  cudaDeviceProp prop{};
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
  const auto datasets = load_datasets(dirs);
  if (datasets.empty()) {
    fprintf(stderr, "no .safetensors data found in the given directories\n");
    return 1;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<Row> rows;
#ifndef TZ_HAVE_NVCOMP
  printf("nvCOMP not available\n");
#endif
  double memcpy_gbps = 0;
  for (const Dataset& ds : datasets) {
    // Items of >= 16 MiB made of whole copies of the real data; enough items
    // for >= target bytes.
    const size_t base = ds.base.size();
    const size_t copies = std::max<size_t>(1, ((16u << 20) + base - 1) / base);
    const size_t item = base * copies;
    const size_t n_items = std::max<size_t>(1, (target + item - 1) / item);
    const size_t total = item * n_items;
    Bytes host_item(item);
    for (size_t c = 0; c < copies; ++c) memcpy(host_item.data() + c * base, ds.base.data(), base);
    uint8_t* d_src;
    CK(cudaMalloc(&d_src, total));
    CK(cudaMemcpy(d_src, host_item.data(), item, cudaMemcpyHostToDevice));
    for (size_t i = 1; i < n_items; ++i) CK(cudaMemcpy(d_src + i * item, d_src, item, cudaMemcpyDeviceToDevice));
    if (memcpy_gbps == 0) {
      uint8_t* d_copy;
      CK(cudaMalloc(&d_copy, total));
      const double ms = median_ms(runs, s, [&] { CK(cudaMemcpyAsync(d_copy, d_src, total, cudaMemcpyDeviceToDevice, s)); });
      memcpy_gbps = gbps(total, ms);
      CK(cudaFree(d_copy));
    }
    printf("%s: %zu items x %.1f MiB = %.2f GB (real data %.1f MiB)\n", ds.kind.c_str(), n_items, item / 1048576.0,
           total / 1e9, base / 1048576.0);
    fflush(stdout);
    const TzRun t = run_tz(d_src, item, n_items, ds.dtype, host_item, runs, s);
    rows.push_back({"tensorzip  " + ds.kind, total / 1e9, t.ratio, gbps(total, t.enc_ms), gbps(total, t.dec_ms),
                    std::string(t.identical ? "frame==CPU" : "frame!=CPU") + (t.ok ? "" : t.note)});
    print_row(rows.back());
#ifdef TZ_HAVE_NVCOMP
    for (int algo = 0; algo < 2; ++algo) {
      const TzRun nv = run_nvcomp(algo, d_src, total, ds.dtype, runs, s);
      rows.push_back({std::string(algo == 0 ? "nvcomp-ANS " : "nvcomp-zstd ") + ds.kind, total / 1e9, nv.ratio,
                      gbps(total, nv.enc_ms), gbps(total, nv.dec_ms), nv.ok ? "" : nv.note});
      print_row(rows.back());
    }
#endif
    CK(cudaFree(d_src));
  }
  // Checkpoint-aware coding (issue 6), prediction fused into the kernels
  // (build_pairings). Same tiling as above (items of >= 16 MiB, >= target
  // bytes); compare the speeds with the plain fp32-master and bf16-weights rows.
  {
    const std::vector<Pairing> pairings = build_pairings(dirs);
    for (const Pairing& pg : pairings) {
      if (pg.values.empty()) {
        printf("%s: no data (run bench/gpu/make_device_data.py)\n", pg.name);
        continue;
      }
      const size_t base = pg.values.size(), pbase = pg.pred.size();
      const size_t copies = std::max<size_t>(1, ((16u << 20) + base - 1) / base);
      const size_t item = base * copies, pitem = pbase * copies;
      const size_t n_items = std::max<size_t>(1, (target + item - 1) / item);
      const size_t total = item * n_items;
      Bytes host_item(item), host_pred(pitem);
      for (size_t c = 0; c < copies; ++c) {
        memcpy(host_item.data() + c * base, pg.values.data(), base);
        memcpy(host_pred.data() + c * pbase, pg.pred.data(), pbase);
      }
      uint8_t *d_src, *d_pred;
      CK(cudaMalloc(&d_src, total));
      CK(cudaMalloc(&d_pred, pitem * n_items));
      CK(cudaMemcpy(d_src, host_item.data(), item, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(d_pred, host_pred.data(), pitem, cudaMemcpyHostToDevice));
      for (size_t i = 1; i < n_items; ++i) {
        CK(cudaMemcpy(d_src + i * item, d_src, item, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(d_pred + i * pitem, d_pred, pitem, cudaMemcpyDeviceToDevice));
      }
      printf("%s: %zu items x %.1f MiB = %.2f GB (real data %.1f MiB)\n", pg.name, n_items, item / 1048576.0,
             total / 1e9, base / 1048576.0);
      fflush(stdout);
      const TzRun t = run_tz(d_src, item, n_items, pg.dt, host_item, runs, s, pg.kind, d_pred, pitem);
      rows.push_back({std::string("tensorzip  ") + pg.name, total / 1e9, t.ratio, gbps(total, t.enc_ms),
                      gbps(total, t.dec_ms), t.ok ? "exact round trip" : t.note});
      print_row(rows.back());
      CK(cudaFree(d_src));
      CK(cudaFree(d_pred));
    }
  }
  rows.push_back({"memcpy D2D (reference)", 0, 1.0, memcpy_gbps, memcpy_gbps, "copy of the first data kind"});

  // Latency: one 1 MiB BF16 (or first kind) tensor per call.
  {
    const Dataset& ds = datasets[0];
    const size_t n = 1u << 20;
    Bytes h(n);
    for (size_t i = 0; i < n; ++i) h[i] = ds.base[i % ds.base.size()];
    uint8_t *d_src, *d_f, *d_o;
    const size_t bound = tz_compress_bound(n);
    CK(cudaMalloc(&d_src, n));
    CK(cudaMalloc(&d_f, bound));
    CK(cudaMalloc(&d_o, n));
    CK(cudaMemcpy(d_src, h.data(), n, cudaMemcpyHostToDevice));
    tz_params p{};
    tz_cuda_compress_item ci{d_src, n, ds.dtype, d_f, bound, {}};
    const size_t ctb = tz_cuda_compress_temp_size(&ci, 1, &p);
    void* temp;
    size_t* d_sz;
    int* d_st;
    CK(cudaMalloc(&temp, std::max<size_t>(ctb, 1 << 20)));
    CK(cudaMalloc(&d_sz, 8));
    CK(cudaMalloc(&d_st, 8));
    const double enc = median_ms(51, s, [&] { tz_cuda_compress(&ci, 1, &p, temp, ctb, d_sz, d_st, s); });
    size_t fs = 0;
    CK(cudaMemcpy(&fs, d_sz, 8, cudaMemcpyDeviceToHost));
    tz_cuda_decompress_item di{d_f, fs, d_o, n, {}};
    const size_t dtb = tz_cuda_decompress_temp_size(&di, 1);
    void* dtemp;
    CK(cudaMalloc(&dtemp, std::max<size_t>(dtb, 256)));
    const double dec = median_ms(51, s, [&] { tz_cuda_decompress(&di, 1, dtemp, dtb, d_sz, d_st, s); });
    char note[128];
    snprintf(note, sizeof note, "latency: enc %.1f us, dec %.1f us", enc * 1e3, dec * 1e3);
    rows.push_back({"tensorzip 1 MiB " + ds.kind, n / 1e9, fs ? (double)n / fs : 0, gbps(n, enc), gbps(n, dec), note});
    for (void* q : {(void*)d_src, (void*)d_f, (void*)d_o, temp, dtemp, (void*)d_sz, (void*)d_st}) CK(cudaFree(q));
  }

  printf("\n| codec / data | GB | ratio | compress GB/s | decompress GB/s | note |\n|---|---:|---:|---:|---:|---|\n");
  for (const Row& r : rows)
    printf("| %s | %.2f | %.3f | %.1f | %.1f | %s |\n", r.name.c_str(), r.gb, r.ratio, r.enc, r.dec, r.note.c_str());
  printf("\n(GB/s of uncompressed bytes, median of %d runs after a warm-up, CUDA events; memcpy counts bytes copied)\n",
         runs);
  CK(cudaStreamDestroy(s));
  return 0;
}

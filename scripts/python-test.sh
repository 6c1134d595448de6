#!/usr/bin/env bash
# Python package tests: installs the test dependencies (python/requirements-test.txt),
# builds and installs the package with `pip install .` (scikit-build-core,
# build dir build-py/), then runs pytest on python/tests.
# Called by scripts/test.sh; runnable alone. Extra arguments go to pytest.
#   TZIP=/path/to/tzip   CLI used by the interoperability tests (default: build/programs/tzip,
#                        built here if missing)
#   TZ_JOBS=N            parallel compile jobs (default 2)
#   TZ_PY_SKIP_LARGE=1   skip the > 2 GiB tests (they skip themselves when memory is short)
#   TZ_PY_TRANSFORMERS_MIN=0|1  run the transformers tests again with the lowest supported
#                        transformers version, in a venv of its own (default: 1 when no pytest
#                        arguments are given)
#   TZ_PY_CUDA=AUTO      TZ_CUDA of the module's build (default AUTO: with the CUDA backend and
#                        TensorWriter.add_cuda where nvcc is found, so that the GPU binding compiles
#                        and its refusal without a device is tested; OFF: CPU only, as a plain
#                        `pip install .`). About one extra minute of compile on 2 cores (doc/python.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
JOBS="${TZ_JOBS:-2}"
PIP=("$PY" -m pip --disable-pip-version-check)

"${PIP[@]}" install -q -r python/requirements-test.txt
CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "${PIP[@]}" install -q --no-build-isolation --force-reinstall --no-deps \
  -C cmake.define.TZ_CUDA="${TZ_PY_CUDA:-AUTO}" .

# The package must have been built with the .tzip container: without it the
# file tests would only skip.
"$PY" - <<'PYEOF'
import sys, tensorzip
if not tensorzip.HAVE_CONTAINER:
    sys.exit("python-test.sh: tensorzip was built without the .tzip container (src/container)")
C = tensorzip._tensorzip
print(f"python-test.sh: tensorzip {tensorzip.__version__} from {tensorzip.__file__}, "
      f"CUDA in the build: {C.HAVE_CUDA}, device: {C.cuda_available()}")
PYEOF

. scripts/build-steps.sh
tz_find_tzip "$JOBS"

set +e
"$PY" -m pytest python/tests -ra -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "python-test.sh: pytest collected no tests: failing" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"

# tensorzip.transformers with the lowest transformers version it supports (the ">=" bound in
# python/requirements-test.txt; the run above used the newest allowed one): its tests again, in a
# venv that holds that version and sees the tensorzip just installed. Runs when pytest got no
# arguments (or TZ_PY_TRANSFORMERS_MIN=1); TZ_PY_TRANSFORMERS_MIN=0 skips it. About 1.5 min.
if [ "${TZ_PY_TRANSFORMERS_MIN:-$([ $# -eq 0 ] && echo 1 || echo 0)}" = 1 ]; then
  MINV="$(sed -n 's/^transformers>=\([0-9.]*\),.*/\1/p' python/requirements-test.txt)"
  VENV="build-py/venv-transformers-$MINV"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
  # [hub-kernels]: that version's own pin of the `kernels` package, installed in the venv, so that
  # a newer `kernels` among the system's packages (newer transformers require it) is not imported
  # by the older transformers, whose hub-kernel code does not run with it.
  "$VENV/bin/python" -m pip --disable-pip-version-check install -q "transformers[hub-kernels]==$MINV" "accelerate>=1.0"
  SITE="$("$PY" -c 'import os, tensorzip; print(os.path.dirname(os.path.dirname(tensorzip.__file__)))')"
  PURE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$SITE" > "$PURE/tensorzip-under-test.pth"   # after the venv's own packages: its transformers wins
  "$VENV/bin/python" - "$MINV" <<'PYEOF'
import sys, transformers, tensorzip
if transformers.__version__ != sys.argv[1]:
    sys.exit(f"python-test.sh: expected transformers {sys.argv[1]}, got {transformers.__version__}")
print(f"python-test.sh: transformers {transformers.__version__}, tensorzip from {tensorzip.__file__}")
PYEOF
  "$VENV/bin/python" -m pytest python/tests/test_transformers.py -ra -p no:cacheprovider
fi

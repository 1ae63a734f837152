#!/usr/bin/env bash
# Create (or update) the virtual environment lmperf runs in: envs/setup.sh [VENV [TORCH_TRITON]]
#  - TORCH_TRITON pins torch and triton (default envs/requirements-cpu.txt: the CPU build of
#    torch, so that pip never pulls the CUDA wheels, and the pinned triton).
#  - With the default, if the python3 that runs this already imports torch and triton (a GPU
#    machine), the venv sees its packages through a .pth file: they are reused, never
#    reinstalled. A TORCH_TRITON given explicitly is always installed (a venv for another
#    triton, e.g. `make test-triton-newest` with envs/requirements-triton-newest.txt).
#  - The rest comes from envs/requirements.txt, constrained to the torch already present.
# Set PYTHON to choose the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
torch_triton=${2:-envs/requirements-cpu.txt}
reuse_host=$([[ -z ${2:-} ]] && echo yes || echo no)
py=${PYTHON:-python3}
quiet() { grep -v -e 'is ignored: it is neither a file nor a directory' || true; }

stamp="$venv/.lmperf-setup"
want="$(cat envs/requirements.txt "$torch_triton" pyproject.toml envs/setup.sh | sha256sum | cut -c1-16)"
if [[ -f $stamp && $(cat "$stamp") == "$want" && -x $venv/bin/python ]]; then
    exit 0  # already set up from these files
fi

if [[ ! -x $venv/bin/python ]]; then
    echo "setup: creating $venv with $($py --version 2>&1)"
    "$py" -m venv "$venv"
fi
vpy="$venv/bin/python"

if [[ $reuse_host == yes ]] && "$py" -c 'import torch, triton' 2>/dev/null; then
    host_site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    venv_site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [[ $host_site != "$venv_site" ]]; then
        echo "$host_site" > "$venv_site/_lmperf_host_packages.pth"
    fi
    echo "setup: reusing torch $("$vpy" -c 'import torch; print(torch.__version__)') and triton from $host_site"
else
    if [[ $reuse_host == yes ]] && command -v nvidia-smi >/dev/null 2>&1; then
        echo "setup: warning: this machine has an NVIDIA GPU but $py has no torch; installing the" \
             "CPU build. For GPU results, install a CUDA build of torch for $py first and rerun." >&2
    fi
    echo "setup: installing $(grep -v '^#' "$torch_triton" | xargs)"
    "$vpy" -m pip install -q --disable-pip-version-check -r "$torch_triton" 2>&1 | quiet
fi

torch_version=$("$vpy" -c 'from importlib.metadata import version; print(version("torch"))')
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" > "$constraints"
echo "setup: installing envs/requirements.txt and lmperf (editable)"
"$vpy" -m pip install -q --disable-pip-version-check -c "$constraints" -r envs/requirements.txt 2>&1 | quiet
"$vpy" -m pip install -q --disable-pip-version-check --no-deps -e . 2>&1 | quiet
"$vpy" -c 'import torch, triton, pandas, jinja2, tabulate, matplotlib, snakemake, lmperf' \
    || { echo "setup: the environment in $venv is incomplete" >&2; exit 1; }
echo "$want" > "$stamp"
echo "setup: ready ($venv)"

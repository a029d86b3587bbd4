#!/usr/bin/env bash
# `make harness`: the harness virtualenv (default .venv-harness) on a Python >= 3.12
# (scripts/build-harness-python.sh finds one, or builds CPython 3.13 once into ~/.cache/tinkrl), with
# Harbor, terminal-bench and tinkrl's adapters. tinkrl goes in with --no-deps (no torch): the adapters
# import only its torch-free modules (see tinkrl/harness/__init__.py). tinkrl itself keeps running
# from the project's .venv on the machine's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-harness}"
py=$(bash scripts/build-harness-python.sh)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" -r scripts/harness-requirements.txt
"${pip[@]}" --no-deps -e .
# litellm (a terminal-bench dependency) fetches a price list at import unless told not to
LITELLM_LOCAL_MODEL_COST_MAP=True "$venv/bin/python" -c '
import harbor, terminal_bench, tinker, transformers
import tinkrl.harness.harbor_agent, tinkrl.harness.harbor_env, tinkrl.harness.terminal_bench
import sys; assert "torch" not in sys.modules, "torch was imported by the harness adapters"
print("harness ready:", sys.executable, sys.version.split()[0], "harbor", harbor.__version__ if hasattr(harbor, "__version__") else "")
'

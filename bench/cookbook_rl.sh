#!/usr/bin/env bash
# tinker-cookbook's own RL recipe, unmodified but for base_url, against `tinkrl serve tinker`.
#
#   bash bench/cookbook_rl.sh            # 3 steps (~30 s on 2 CPU cores once installed)
#   STEPS=10 PORT=18800 bash bench/cookbook_rl.sh
#   bash bench/cookbook_rl.sh --install-only   # only prepare its virtualenv (`make bench-deps` runs this)
#
# Recipe: tinker_cookbook.recipes.math_rl.train with env=arithmetic (synthetic problems, no
# dataset download), on SmolLM2-135M-Instruct from the engine's local cache (passed as a
# directory so the cookbook's tokenizer loads offline), renderer role_colon.
#
# The cookbook lives in its own virtualenv ($COOKBOOK_VENV): its PyPI release 0.5.8 pins
# transformers<=5.5.4, which must not replace the project's transformers, and 0.6.1 needs
# tml-renderers>=0.4.1, not on the package index this was built with. Both speak the
# tinker 0.38.0 protocol the server implements.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${COOKBOOK_VENV:-$HOME/.cache/tinkrl/cookbook-venv}
PORT=${PORT:-18765}
STEPS=${STEPS:-3}
LOG_PATH=${LOG_PATH:-runs/cookbook-math-rl}

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import tinker_cookbook" 2>/dev/null; then
  echo "installing tinker-cookbook into $VENV ..."
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -c constraints.txt "tinker-cookbook[math-rl]==0.5.8"
fi
if [ "${1:-}" = "--install-only" ]; then
  echo "tinker-cookbook is ready in $VENV"
  exit 0
fi

MODEL_DIR=$(.venv/bin/python -c 'from tinkrl.local.models import DEFAULT_MODEL, resolve_model_dir; print(resolve_model_dir(DEFAULT_MODEL))')

.venv/bin/python -m tinkrl.cli serve tinker --port "$PORT" --log-level WARNING &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/api/v1/healthz" >/dev/null && break
  sleep 0.5
done

TINKER_API_KEY=tml-local TINKER_TELEMETRY=0 HF_HUB_OFFLINE=1 \
  "$VENV/bin/python" -m tinker_cookbook.recipes.math_rl.train \
  base_url="http://127.0.0.1:$PORT" \
  env=arithmetic model_name="$MODEL_DIR" renderer_name=role_colon \
  group_size=4 groups_per_batch=4 max_tokens=5 lora_rank=8 learning_rate=1e-4 \
  max_steps="$STEPS" eval_every=0 save_every=0 \
  log_path="$LOG_PATH" behavior_if_log_dir_exists=delete
echo "cookbook recipe finished: $LOG_PATH/metrics.jsonl"

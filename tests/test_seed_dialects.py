"""The seeds' own commands and configs, as written, resolve to the plans their sources meant.

Each seed-001 (`tinking`) trainer command and each seed-002 (OpenReward) tinker-config.yaml is
run through `tinkrl train ... --dry-run` (`python tinking/trainer.py` / `python main.py` replaced
by `tinkrl train`) and the printed JSON plan is checked key by key. A dry run contacts no service
(a Tinker URL that nobody listens on is fine) and downloads nothing.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest
from helpers.ors import free_port

from tinkrl.cli import main as tinkrl
from tinkrl.config import load_config
from tinkrl.errors import ConfigError


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no stray .env or runs/ from the checkout
    for var in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))  # the seeds' models are not on this machine
    return tmp_path


def dry_run(capsys, command: str) -> dict:
    argv = shlex.split(command)
    assert tinkrl(["train", *argv, "--dry-run"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# seed 001, "test trainer" / "rl on papergym" / "rl on ttt-discovery" / "rl on beaker", as written
ARITHMETIC = """model_name=meta-llama/Llama-3.2-1B batch_size=100 group_size=4 optim.lr=1e-4 env=MathConfig
  env.dataset=arithmetic env.max_tokens=5 wandb.entity=ai2-llm wandb.project=tinker wandb.run_name=debug-arithmetic"""
MATH500 = """model_name=Qwen/Qwen3-4B-Instruct-2507 num_batches=5 group_size=4 wandb.enabled=True wandb.entity=ai2-llm
  wandb.project=tinker wandb.run_name=debug-math-500 env=MathConfig env.dataset=math500 env.max_tokens=2048"""
HENDRYCKS = """model_name=Qwen/Qwen3-8B group_size=16 batch_size=64 optim.lr=2e-5 env=MathConfig env.dataset=hendrycks
  env.max_tokens=512 wandb.entity=ai2-llm wandb.project=tinker wandb.run_name=debug-math-hendrycks"""
HELLO = """model_name=Qwen/Qwen3-8B num_batches=5 group_size=4 wandb.enabled=False
  minitb.dataset=terminal-bench-core==0.1.1 minitb.task_id=hello-world"""
HELLO_WANDB = """model_name=Qwen/Qwen3-8B num_batches=100 group_size=16 wandb.run_name=debug-hello-world
  minitb.dataset=terminal-bench-core==0.1.1 minitb.task_id=hello-world"""
PAPERGYM = """model_name=Qwen/Qwen3-8B num_batches=100 group_size=16 wandb.enabled=False
  minitb.dataset_path=~/ai2/papergym/papers"""
PAPERGYM_BIG = """model_name=Qwen/Qwen3-235B-A22B-Instruct-2507 num_batches=100 group_size=16
  wandb.run_name=papergym minitb.dataset_path=~/ai2/papergym/papers"""
ERDOS = """model_name=openai/gpt-oss-20b num_batches=50 batch_size=512 group_size=64 lora_rank=32 adv_estimator=entropic
  adv_beta=2.0 env=ErdosConfig env.n_points=200 env.buffer_size=16 env.epsilon=0.125 env.max_tokens=2048
  env.teacher_forcing=True env.context_window_tokens=4096 wandb.enabled=False"""
ERDOS_BEAKER = """model_name=openai/gpt-oss-20b num_batches=50 batch_size=512 group_size=64 lora_rank=32
  adv_estimator=entropic adv_beta=2.0 log_path=/results env=ErdosConfig env.n_points=200 env.buffer_size=16
  env.epsilon=0.125 env.max_tokens=26000 env.teacher_forcing=True env.context_window_tokens=32768
  wandb.enabled=True wandb.entity=ai2-llm wandb.project=tinker wandb.run_name=erdos-ttt"""
HELLO_BEAKER = """model_name=Qwen/Qwen3-8B num_batches=100 group_size=16 log_path=/results
  wandb.run_name=debug-hello-world minitb.dataset="terminal-bench-core==0.1.1" minitb.task_id=hello-world"""
POLARIS = """model_name=meta-llama/Llama-3.1-8B-Instruct num_batches=100 group_size=16 wandb.enabled=True
  wandb.entity=ai2-llm wandb.project=tinker wandb.run_name=debug-math-500 env=MathConfig env.dataset=polaris
  env.max_tokens=16384"""
PAPERGYM_BEAKER = """model_name=Qwen/Qwen3-235B-A22B-Instruct-2507 num_batches=100 group_size=16 log_path=/results
  wandb.run_name=papergym minitb.dataset_path=~/ai2/papergym/papers"""

# (command, env type, env fields that must be in the plan, groups/step, rollouts/step, steps, W&B run name or None)
SEED_001 = {
    "arithmetic": (ARITHMETIC, "math", {"dataset": "arithmetic", "max_tokens": 5}, 25, 100, 20, "debug-arithmetic"),
    "math500": (MATH500, "math", {"dataset": "math500", "max_tokens": 2048}, 16, 64, 5, "debug-math-500"),
    "hendrycks": (HENDRYCKS, "math", {"dataset": "hendrycks", "max_tokens": 512}, 4, 64, 20, "debug-math-hendrycks"),
    "hello": (HELLO, "tasks", {"dataset": "terminal-bench-core==0.1.1", "task_ids": ["hello-world"]}, 16, 64, 5, None),
    "hello_wandb": (
        HELLO_WANDB,
        "tasks",
        {"dataset": "terminal-bench-core==0.1.1", "task_ids": ["hello-world"]},
        4,
        64,
        100,
        "debug-hello-world",
    ),
    "papergym": (PAPERGYM, "tasks", {"path": "~/ai2/papergym/papers"}, 4, 64, 100, None),
    "papergym_big": (PAPERGYM_BIG, "tasks", {"path": "~/ai2/papergym/papers"}, 4, 64, 100, "papergym"),
    "erdos": (ERDOS, "erdos", {"n_points": 200, "max_tokens": 2048, "context_window_tokens": 4096}, 8, 512, 50, None),
    "erdos_beaker": (
        ERDOS_BEAKER,
        "erdos",
        {"max_tokens": 26000, "context_window_tokens": 32768},
        8,
        512,
        50,
        "erdos-ttt",
    ),
    "hello_beaker": (HELLO_BEAKER, "tasks", {"task_ids": ["hello-world"]}, 4, 64, 100, "debug-hello-world"),
    "polaris": (POLARIS, "math", {"dataset": "polaris", "max_tokens": 16384}, 4, 64, 100, "debug-math-500"),
    "papergym_beaker": (PAPERGYM_BEAKER, "tasks", {"path": "~/ai2/papergym/papers"}, 4, 64, 100, "papergym"),
}


# the renderer each seed model is trained with: tinker-cookbook's recommendation (a base model's is role_colon)
RENDERERS = {
    "meta-llama/Llama-3.2-1B": "role_colon",
    "meta-llama/Llama-3.1-8B-Instruct": "llama3",
    "Qwen/Qwen3-4B-Instruct-2507": "qwen3_instruct",
    "Qwen/Qwen3-235B-A22B-Instruct-2507": "qwen3_instruct",
    "Qwen/Qwen3-8B": "qwen3",
    "Qwen/Qwen3-30B-A3B": "qwen3",
    "openai/gpt-oss-20b": "gpt_oss_no_sysprompt",
}


@pytest.mark.parametrize("name", list(SEED_001))
def test_seed_001_commands_as_written(capsys, monkeypatch, name):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")  # the seed's setup: export TINKER_API_KEY=...
    command, env_type, fields, groups, rollouts, steps, wandb_run = SEED_001[name]
    plan = dry_run(capsys, command)
    assert plan["dialect"] == "tinking" and plan["problems"] == []
    assert plan["backend"] == "tinker" and "is not on this machine" in plan["backend_reason"]
    [(key, env)] = plan["environments"].items()
    assert env["type"] == env_type
    for field, value in fields.items():
        expected = str(Path(value).expanduser()) if field == "path" else value
        assert env["config"][field] == expected, field
    assert (plan["groups_per_step"], plan["rollouts_per_step"], plan["max_steps"]) == (groups, rollouts, steps)
    assert plan["model_name"] in command and plan["renderer"] == RENDERERS[plan["model_name"]]
    if "optim.lr=" in command:
        assert plan["learning_rate"] == float(command.split("optim.lr=")[1].split()[0])
    if wandb_run is None:
        assert plan["wandb"] == {"enabled": False}
    else:  # tinking logs to W&B unless wandb.enabled=False
        assert plan["wandb"]["enabled"] and plan["wandb"]["run_name"] == wandb_run
        assert plan["wandb"]["mode"] == "offline" and "problem" not in plan["wandb"]
        if "wandb.entity=" in command:
            assert plan["wandb"]["entity"] == "ai2-llm" and plan["wandb"]["project"] == "tinker"
    if "log_path=" in command:
        assert plan["log_path"] == "/results"
    else:  # a fresh directory per run, named for its environment
        assert plan["log_path"].startswith(f"runs/{key}-")


def test_seed_001_erdos_takes_its_entropic_estimator_and_lora_rank(capsys):
    plan = dry_run(capsys, ERDOS)
    assert plan["adv_estimator"] == "entropic" and plan["lora_rank"] == 32


def test_wandb_without_a_login_is_named_in_the_plan_and_stops_a_real_run(capsys):
    plan = dry_run(capsys, HELLO_WANDB)
    assert plan["wandb"]["enabled"] and "wandb login" in plan["wandb"]["problem"]
    assert tinkrl(["train", *shlex.split(HELLO_WANDB)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tinkrl train: error: W&B logging is on") and "\n" not in err


OPENREWARD_YAML = """\
wandb_project_name: "tinker-test"
wandb_run_name: "tinker-rl-test-openreward"
openreward_run_name: "tinker-rl-test-openreward"
log_path: "/tmp/tinker-rl"
model_name: "Qwen/Qwen3-30B-A3B"
lora_rank: 8
# resume_from: "tinker://run-id/weights/checkpoint_000050"  # Optional
loss_fn: "ppo"  # Options: importance_sampling, ppo, cispo, dro
batch_size: 32
learning_rate: 1e-5
save_every: 10  # Save checkpoint every N steps
environments:
  GeneralReasoning/WhoDunIt:  # Browse at https://openreward.ai/environments
    splits:
      train:
        shuffle: true
        num_samples: null  # null = use all tasks
    num_rollouts: 16
    max_failing_rollouts: 2
    temperature: 1.0
    reward_reduction: "sum"
    nonterminal_reward: 0.0
"""

OPENREWARD_MULTI = """\
wandb_project_name: "tinker-test"
model_name: "Qwen/Qwen3-30B-A3B"
batch_size: 32
environments:
  GeneralReasoning/WhoDunIt:
    splits:
      train:
        shuffle: true
    num_rollouts: 16
    temperature: 1.0
    reward_reduction: "sum"

  MATH/GSM8K:
    splits:
      train:
        shuffle: true
    num_rollouts: 8
    temperature: 0.7
    reward_reduction: "mean"
"""


def test_seed_002_config_as_written(capsys, in_tmp, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    (in_tmp / "tinker-config.yaml").write_text(OPENREWARD_YAML)
    plan = dry_run(capsys, "--config_path tinker-config.yaml")
    assert plan["dialect"] == "openreward" and "wandb_project_name" in plan["dialect_reason"]
    assert plan["groups_per_step"] == 32 and plan["rollouts_per_step"] == 32 * 16  # batch_size counts task groups
    env = plan["environments"]["GeneralReasoning/WhoDunIt"]
    assert env["type"] == "openreward" and env["group_size"] == 16 and env["max_failing_rollouts"] == 2
    assert (plan["loss_fn"], plan["learning_rate"], plan["lora_rank"]) == ("ppo", 1e-5, 8)
    # the trainer's own defaults: no thinking, centered_normalized advantages, 4096 tokens per reply
    assert plan["renderer"] == "qwen3_disable_thinking" and plan["adv_estimator"] == "centered_normalized"
    assert plan["max_tokens"] == 4096
    assert plan["wandb"] == {
        "enabled": True,
        "entity": None,
        "project": "tinker-test",
        "run_name": "tinker-rl-test-openreward",
        "mode": "online",
    }
    assert plan["openreward"] == {"upload": True, "run_name": "tinker-rl-test-openreward"}
    # log_path is where that trainer's runs log, each run afresh: a directory of its own under it
    assert plan["log_path"].startswith("/tmp/tinker-rl/GeneralReasoning-WhoDunIt-")
    assert dry_run(capsys, "--config_path tinker-config.yaml")["log_path"] != plan["log_path"]
    # --overrides, as in its README
    plan = dry_run(
        capsys,
        "--config_path tinker-config.yaml --overrides batch_size=64 learning_rate=2e-5 loss_fn=importance_sampling",
    )
    assert plan["groups_per_step"] == 64 and plan["learning_rate"] == 2e-5 and plan["loss_fn"] == "importance_sampling"


def test_seed_002_multi_environment_groups(capsys, in_tmp, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    (in_tmp / "tinker-config.yaml").write_text(OPENREWARD_MULTI)
    plan = dry_run(capsys, "--config_path tinker-config.yaml")
    envs = plan["environments"]
    assert envs["GeneralReasoning/WhoDunIt"]["group_size"] == 16 and envs["MATH/GSM8K"]["group_size"] == 8
    assert envs["MATH/GSM8K"]["temperature"] == 0.7
    assert envs["GeneralReasoning/WhoDunIt"]["groups_per_step"] == envs["MATH/GSM8K"]["groups_per_step"] == 16
    assert plan["groups_per_step"] == 32 and plan["rollouts_per_step"] == 16 * 16 + 16 * 8


def test_seed_002_resume_from_restores_weights_and_optimizer(capsys, in_tmp, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    text = OPENREWARD_YAML.replace("# resume_from:", "resume_from:")
    (in_tmp / "tinker-config.yaml").write_text(text)
    plan = dry_run(capsys, "--config_path tinker-config.yaml")
    assert (
        plan["start"]
        == "new run from checkpoint tinker://run-id/weights/checkpoint_000050 (weights and optimizer state)"
    )


def test_backend_auto(capsys, monkeypatch, in_tmp):
    monkeypatch.setenv("HF_HUB_CACHE", str(in_tmp / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # no key: local (a model not on disk would be downloaded, and the plan says so)
    plan = dry_run(capsys, "env=arithmetic")
    assert plan["backend"] == "local" and plan["backend_reason"] == "TINKER_API_KEY is not set"
    assert plan["model"].startswith("HuggingFaceTB/SmolLM2-135M-Instruct: on disk")
    plan = dry_run(capsys, "env=arithmetic model_name=Qwen/Qwen3-8B")
    assert plan["model"].startswith("Qwen/Qwen3-8B: not on disk; downloaded once from")
    assert not (in_tmp / "hf").exists()  # and the dry run downloaded nothing
    # a key, and a model only the service has: tinker, without contacting it
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    t0 = time.time()
    plan = dry_run(capsys, "env=arithmetic model_name=Qwen/Qwen3-235B-A22B-Instruct-2507")
    assert plan["backend"] == "tinker" and "not on this machine" in plan["backend_reason"]
    # a key, and the default model, which is on this machine: local
    plan = dry_run(capsys, "env=arithmetic")
    assert plan["backend"] == "local" and "is on this machine" in plan["backend_reason"]
    # a key and a service URL (nobody listens there: a dry run never connects): tinker
    monkeypatch.setenv("TINKER_BASE_URL", f"http://127.0.0.1:{free_port()}")
    plan = dry_run(capsys, "env=arithmetic")
    assert plan["backend"] == "tinker" and "TINKER_BASE_URL" in plan["backend_reason"]
    assert time.time() - t0 < 30  # no retries against a service
    # an explicit choice wins
    plan = dry_run(capsys, "env=arithmetic backend=local")
    assert plan["backend"] == "local" and plan["backend_reason"] == "set in the config"


def test_renderer_override(capsys):
    plan = dry_run(capsys, "env=arithmetic model_name=meta-llama/Llama-3.2-1B renderer=chatml")
    assert plan["renderer"] == "chatml"
    assert tinkrl(["train", "env=arithmetic", "renderer=llama4", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "renderer: unknown renderer 'llama4'" in err and "llama3" in err and "gpt_oss_no_sysprompt" in err


def test_dialect_errors():
    with pytest.raises(ConfigError, match="mixes the tinking dialect .*optim.lr.* openreward one .*wandb_run_name"):
        load_config(None, ["env=arithmetic", "optim.lr=1e-4", "wandb_run_name=x"])
    with pytest.raises(ConfigError, match="optim.momentum.*lr"):
        load_config(None, ["env=arithmetic", "optim.momentum=0.9"])
    with pytest.raises(ConfigError, match="minitb.n_concurrent.*dataset_path"):
        load_config(None, ["minitb.n_concurrent=2"])
    # an explicit dialect reads keys as that dialect's: tinkrl has no wandb_run_name
    with pytest.raises(ConfigError, match="unknown config key 'wandb_run_name'"):
        load_config(None, ["env=arithmetic", "dialect=tinkrl", "wandb_run_name=x"])
    c = load_config(None, ["env=arithmetic", "dialect=openreward", "batch_size=3"])
    assert (
        c.dialect == "openreward"
        and c.dialect_reason == "set in the config"
        and c.groups_per_env() == {"arithmetic": 3}
    )


def test_losses_are_refused_at_config_time_when_they_cannot_train():
    with pytest.raises(ConfigError, match="cross_entropy is a supervised loss"):
        load_config(None, ["env=arithmetic", "loss_fn=cross_entropy"])
    with pytest.raises(ConfigError, match="dro needs loss_fn_config.beta"):
        load_config(None, ["env=arithmetic", "loss_fn=dro"])
    assert load_config(None, ["env=arithmetic", "loss_fn=dro", "loss_fn_config.beta=0.05"]).loss_fn == "dro"


def test_seed_002_keys_beyond_the_readme(capsys, in_tmp, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    extra = "max_response_tokens: 1024\nadvantage_calculation: centered\nthinking: true\nmax_total_tokens: 8192\n"
    extra += "secrets: {openai_api_key: null}\nseed: 7\n"
    (in_tmp / "tinker-config.yaml").write_text(OPENREWARD_YAML + extra)
    plan = dry_run(capsys, "--config_path tinker-config.yaml")
    assert (plan["max_tokens"], plan["adv_estimator"], plan["renderer"]) == (1024, "centered", "qwen3")
    env = plan["environments"]["GeneralReasoning/WhoDunIt"]["config"]
    assert env["max_total_tokens"] == 8192 and env["secrets"] == {"openai_api_key": None}
    (in_tmp / "epochs.yaml").write_text(OPENREWARD_YAML + "num_epochs: 3\n")
    with pytest.raises(ConfigError, match="num_epochs: not read by tinkrl .*max_steps"):
        load_config("epochs.yaml", [])


def test_command_line_values_keep_their_text():
    c = load_config(None, ["env=arithmetic", "wandb.run_name=2024-01-01", "run_name=123", "wandb.enabled=yes"])
    assert c.wandb.run_name == "2024-01-01" and c.run_name == "123" and c.wandb.enabled is True
    c = load_config(None, ["env=arithmetic", "num_batches=3", "max_steps=5"])  # the later one wins
    assert c.max_steps == 5


def test_dialect_choices_and_conflicts(in_tmp):
    (in_tmp / "d.yaml").write_text("dialect: openreward\nenv: arithmetic\nbatch_size: 4\ngroup_size: 2\n")
    assert load_config("d.yaml", []).groups_per_step == 4
    c = load_config("d.yaml", ["dialect=tinkrl"])  # the command line wins over the file
    assert c.dialect == "tinkrl" and c.groups_per_step is None and c.batch_size == 4
    with pytest.raises(ConfigError, match="minitb.* picks the terminal-bench tasks environment.*env=math"):
        load_config(None, ["minitb.dataset=terminal-bench-core==0.1.1", "env=MathConfig"])
    with pytest.raises(ConfigError, match="env=arithmetic and environments.gsm8k name two environments"):
        load_config(None, ["env=arithmetic", "environments.gsm8k.num_rollouts=4"])


def test_unnamed_runs_started_together_get_their_own_directories():
    names = {load_config(None, ["env=arithmetic"]).run_name for _ in range(5)}
    assert len(names) == 5


def test_backend_auto_follows_explicit_service_and_engine_options(capsys, monkeypatch):
    plan = dry_run(capsys, "env=arithmetic base_url=http://127.0.0.1:1")
    assert plan["backend"] == "tinker" and plan["backend_reason"] == "base_url names a Tinker service"
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    plan = dry_run(capsys, "env=arithmetic model_name=Qwen/Qwen3-8B device=cpu")
    assert plan["backend"] == "local" and plan["backend_reason"].startswith("device is set")


def test_a_model_the_local_engine_cannot_train_is_a_problem_of_the_plan(capsys):
    plan = dry_run(capsys, "env=arithmetic model_name=openai/gpt-oss-20b")
    assert plan["backend"] == "local"
    [problem] = plan["problems"]
    assert "cannot hold openai/gpt-oss-20b: a mixture of experts (gpt_oss)" in problem and "backend=tinker" in problem
    assert tinkrl(["train", "env=arithmetic", "model_name=openai/gpt-oss-20b"]) == 2  # before any download
    assert "cannot hold openai/gpt-oss-20b" in capsys.readouterr().err
    assert dry_run(capsys, "env=arithmetic model_name=Qwen/Qwen3-8B")["problems"] == []


@pytest.mark.parametrize(
    "model,why",
    [
        ("Qwen/Qwen3.5-4B", "hybrid linear/full attention"),
        ("Qwen/Qwen3.6-35B-A3B", "mixture of experts"),
        ("Qwen/Qwen3-VL-30B-A3B-Instruct", "vision-language"),
        ("Qwen/Qwen3-30B-A3B", "mixture of experts"),
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "hybrid Mamba"),
        ("zai-org/GLM-5.3", "mixture of experts"),
    ],
)
def test_the_embedded_engine_refuses_what_it_cannot_hold_in_one_line(capsys, model, why):
    [problem] = dry_run(capsys, f"env=arithmetic model_name={model} backend=local")["problems"]
    assert f"cannot hold {model}: " in problem and why in problem and "backend=tinker" in problem
    assert "\n" not in problem

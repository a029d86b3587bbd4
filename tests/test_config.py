"""Run config: every kind of bad input is exit code 2 and one line from `tinkrl train`, naming the key
(and what is allowed) or the file and line; the accepted spellings (YAML + overrides, --config_path,
aliases, env= sugar) load as documented; `.env` supplies keys without overriding the environment."""

from __future__ import annotations

import os

import pytest

from tinkrl.cli import main as tinkrl
from tinkrl.commands.train import parse_cli
from tinkrl.config import load_config, load_dotenv_file
from tinkrl.errors import ConfigError


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no stray .env or runs/ from the checkout
    return tmp_path


def train_error(capsys, *argv: str) -> str:
    assert tinkrl(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tinkrl train: error: ") and "\n" not in err, err
    return err


def test_unknown_top_level_key(capsys):
    err = train_error(capsys, "env=arithmetic", "lerning_rate=1e-3")
    assert "'lerning_rate'" in err and "learning_rate" in err and "async" in err and "async_" not in err


def test_unknown_nested_keys_name_the_allowed_ones(capsys):
    err = train_error(capsys, "env=arithmetic", "wandb.projekt=x")
    assert "wandb.projekt" in err and "project" in err and "entity" in err
    err = train_error(capsys, "env=arithmetic", "environments.arithmetic.wieght=2")
    assert "wieght" in err and "weight" in err and "num_rollouts" in err


def test_unknown_env_key(capsys):
    err = train_error(capsys, "env=arithmetic", "env.max_valu=50")
    assert "environments.arithmetic.env" in err and "'max_valu'" in err and "max_value" in err


def test_unknown_environment(capsys):
    err = train_error(capsys, "env=no_such_env")
    assert "no_such_env" in err and "arithmetic" in err


def test_bad_values(capsys):
    err = train_error(capsys, "env=arithmetic", "learning_rate=-1")
    assert "learning_rate" in err and "greater than 0" in err and "-1" in err
    err = train_error(capsys, "env=arithmetic", "env.max_value=abc")
    assert "environments.arithmetic.env.max_value" in err and "abc" in err
    err = train_error(capsys, "env=arithmetic", "batch_size=ten")
    assert "batch_size" in err and "ten" in err


def test_bad_literal_lists_the_choices(capsys):
    err = train_error(capsys, "env=arithmetic", "loss_fn=ppo2")
    assert "loss_fn" in err and "'ppo2'" in err and "'cispo'" in err and "'importance_sampling'" in err
    err = train_error(capsys, "env=arithmetic", "adv_estimator=gae")
    assert "adv_estimator" in err and "'entropic_adaptive'" in err


def test_batch_size_must_be_a_multiple_of_group_size(capsys):
    err = train_error(capsys, "env=arithmetic", "batch_size=10", "group_size=4")
    assert "batch_size (10) must be a multiple of group_size (4)" in err and "Value error" not in err
    err = train_error(capsys, "env=arithmetic", "groups_per_batch=4")
    assert "groups_per_step" in err
    err = train_error(capsys, "env=arithmetic", "groups_per_step=4", "batch_size=16")
    assert "batch_size" in err and "groups_per_step" in err and "not both" in err


def test_no_environment_and_malformed_override(capsys):
    assert "no environment" in train_error(capsys, "lora_rank=4")
    assert "not key=value" in train_error(capsys, "env=arithmetic", "lora_rank")


def test_missing_and_malformed_yaml_files(capsys, in_tmp):
    err = train_error(capsys, "--config_path", "nope.yaml")
    assert "nope.yaml" in err and "not found" in err
    bad = in_tmp / "bad.yaml"
    bad.write_text("learning_rate: 1e-4\nenv: arithmetic\nbatch_size: [8\ngroup_size: 4\n")
    err = train_error(capsys, str(bad))
    assert f"{bad}:" in err and "malformed YAML" in err
    line = int(err.split(f"{bad}:")[1].split(":")[0])
    assert line in (3, 4)  # where the unclosed list is noticed
    (in_tmp / "list.yaml").write_text("- a\n- b\n")
    assert "mapping" in train_error(capsys, str(in_tmp / "list.yaml"))
    (in_tmp / "unknown.yaml").write_text("env: arithmetic\nmax_step: 3\n")
    assert "'max_step'" in train_error(capsys, str(in_tmp / "unknown.yaml"))


def test_config_path_and_overrides(in_tmp):
    (in_tmp / "run.yaml").write_text(
        "learning_rate: 1.0e-4\nlora_rank: 8\nenvironments:\n  arithmetic:\n    env: {max_value: 20}\n"
    )
    path, overrides, dry_run = parse_cli(
        ["--config_path", "run.yaml", "--overrides", "lora_rank=4", "wandb.project=p", "--dry-run"]
    )
    assert path == "run.yaml" and overrides == ["lora_rank=4", "wandb.project=p"] and dry_run
    c = load_config(path, overrides)
    assert c.learning_rate == 1e-4 and c.lora_rank == 4 and c.wandb.project == "p"
    assert c.environments["arithmetic"].env == {"max_value": 20}
    # positional YAML + key=value, and env.* overrides reach the single map entry
    c = load_config(*parse_cli(["run.yaml", "env.max_value=50", "max_tokens=12"])[:2])
    assert c.environments["arithmetic"].env == {"max_value": 50} and c.max_tokens == 12


def test_aliases():
    c = load_config(None, ["env=arithmetic", "num_batches=7", "wandb.project=proj"])
    assert c.max_steps == 7 and c.wandb.project == "proj" and c.dialect == "tinkrl" and not c.wandb.enabled


def test_yaml_aliases(in_tmp):
    (in_tmp / "a.yaml").write_text("env: arithmetic\nnum_batches: 3\nwandb:\n  project: q\n")
    c = load_config("a.yaml", [])
    assert c.max_steps == 3 and c.wandb.project == "q"


def test_env_sugar():
    c = load_config(None, ["env=arithmetic", "env.max_value=50", "env.min_value=3"])
    assert list(c.environments) == ["arithmetic"]
    assert c.environments["arithmetic"].env == {"max_value": 50, "min_value": 3}
    full = load_config(None, ["environments.arithmetic.env.max_value=50", "environments.arithmetic.env.min_value=3"])
    assert full.environments == c.environments
    # groups per step = batch_size / group_size
    c = load_config(None, ["env=arithmetic", "batch_size=12", "group_size=4"])
    assert c.groups_per_env() == {"arithmetic": 3}


def test_yaml_env_shorthand(in_tmp):
    (in_tmp / "e.yaml").write_text("env: arithmetic\nenv_config:\n  max_value: 50\n  min_value: 3\n")
    c = load_config("e.yaml", [])
    assert c.environments["arithmetic"].env == {"max_value": 50, "min_value": 3}
    c = load_config("e.yaml", ["env.max_value=60"])  # overrides go on top of env_config
    assert c.environments["arithmetic"].env == {"max_value": 60, "min_value": 3}
    c = load_config("e.yaml", ["environments.arithmetic.env.max_value=70"])  # the map's spelling wins too
    assert c.environments["arithmetic"].env == {"max_value": 70, "min_value": 3}
    c = load_config("e.yaml", ["env=gsm8k"])  # the command line picks another env: the YAML's fields are dropped
    assert list(c.environments) == ["gsm8k"] and c.environments["gsm8k"].env == {}


def test_env_override_against_an_environments_map(in_tmp):
    (in_tmp / "m.yaml").write_text("environments:\n  arithmetic: {env: {max_value: 20}}\n  gsm8k: {}\n")
    assert set(load_config("m.yaml", []).environments) == {"arithmetic", "gsm8k"}
    c = load_config("m.yaml", ["env=arithmetic"])  # one entry of the map, with its fields
    assert list(c.environments) == ["arithmetic"] and c.environments["arithmetic"].env == {"max_value": 20}
    with pytest.raises(ConfigError, match="not both"):
        load_config("m.yaml", ["env=math500"])
    with pytest.raises(ConfigError, match="env=NAME"):
        load_config("m.yaml", ["env.max_value=5"])


def test_env_fields_need_an_environment():
    with pytest.raises(ConfigError, match="env=NAME"):
        load_config(None, ["env.max_value=5"])


def test_dotenv_loading(in_tmp, monkeypatch):
    monkeypatch.delenv("TINKRL_TEST_DOTENV_A", raising=False)
    monkeypatch.setenv("TINKRL_TEST_DOTENV_B", "from-environment")
    (in_tmp / ".env").write_text("TINKRL_TEST_DOTENV_A=from-file\nTINKRL_TEST_DOTENV_B=from-file\n")
    load_dotenv_file()
    try:
        assert os.environ["TINKRL_TEST_DOTENV_A"] == "from-file"
        assert os.environ["TINKRL_TEST_DOTENV_B"] == "from-environment"  # never overrides
    finally:
        os.environ.pop("TINKRL_TEST_DOTENV_A", None)


def test_train_cli_reads_dotenv(capsys, in_tmp):
    """`tinkrl train` loads ./.env before anything else: a key set there is visible to the run."""
    os.environ.pop("TINKRL_TEST_DOTENV_C", None)
    (in_tmp / ".env").write_text("TINKRL_TEST_DOTENV_C=yes\n")
    try:
        train_error(capsys, "lora_rank=4")  # fails on config after .env was read
        assert os.environ.get("TINKRL_TEST_DOTENV_C") == "yes"
    finally:
        os.environ.pop("TINKRL_TEST_DOTENV_C", None)


def test_sandbox_provider_options_reach_the_provider():
    """`sandbox.bwrap.*` (warm pool, pid-1 server) are the bwrap provider's own keyword arguments."""
    import inspect

    from tinkrl.sandbox.bwrap import BwrapProvider

    c = load_config(None, ["env=arithmetic", "sandbox.bwrap.pool=2", "sandbox.bwrap.server=python"])
    options = c.sandbox.provider_options()
    assert options == {"pool": 2, "server": "python"}
    assert set(options) <= set(inspect.signature(BwrapProvider).parameters)
    with pytest.raises(ConfigError, match="server"):
        load_config(None, ["env=arithmetic", "sandbox.bwrap.server=rust"])
    docker = load_config(None, ["env=arithmetic", "sandbox.provider=docker"]).sandbox.provider_options()
    assert "pool" not in docker


def test_help_and_config_errors_answer_without_torch(in_tmp):
    """`tinkrl train --help` documents every key, and a config error is reported, without importing torch."""
    import subprocess
    import sys

    probe = (
        "import sys, tinkrl.cli\n"
        "try:\n    code = tinkrl.cli.main(sys.argv[1:])\n"
        "except SystemExit as e:\n    code = e.code\n"
        "print('TORCH', 'torch' in sys.modules, 'CODE', code)\n"
    )
    help_out = subprocess.run([sys.executable, "-c", probe, "train", "--help"], capture_output=True, text=True)
    assert "TORCH False CODE 0" in help_out.stdout, help_out.stdout + help_out.stderr
    assert "learning_rate = 0.0004\n      Adam learning rate." in help_out.stdout
    assert "environments.<key>" not in help_out.stdout and "wandb.project = None" in help_out.stdout
    bad = subprocess.run(
        [sys.executable, "-c", probe, "train", "env=arithmetic", "lora_rank=0"], capture_output=True, text=True
    )
    assert "TORCH False CODE 2" in bad.stdout and "lora_rank" in bad.stderr, bad.stdout + bad.stderr
    for env in ("arithmetic", "ErdosConfig", "tasks", "Owner/Env"):  # each environment's own config class too
        bad = subprocess.run(
            [sys.executable, "-c", probe, "train", f"env={env}", "env.no_such_field=1"], capture_output=True, text=True
        )
        assert "TORCH False CODE 2" in bad.stdout and "no_such_field" in bad.stderr, bad.stdout + bad.stderr


def test_an_environment_type_sets_its_run_defaults_unless_the_user_did():
    """erdos asks for entropic advantages; the user's own choice, or another environment in the run, wins."""
    from tinkrl.commands.train import load

    assert load(None, ["env=ErdosConfig"]).adv_estimator == "entropic"
    assert load(None, ["env=ErdosConfig", "adv_estimator=grpo"]).adv_estimator == "grpo"
    assert load(None, ["env=arithmetic"]).adv_estimator == "grpo"
    mixed = ["environments.erdos.type=erdos", "environments.arithmetic.type=arithmetic"]
    assert load(None, mixed).adv_estimator == "grpo"


def test_yaml_sections_keep_dotted_keys_and_merge_with_overrides(in_tmp):
    (in_tmp / "s.yaml").write_text(
        "env: arithmetic\nwandb: {project: q}\nsandbox:\n  kubernetes:\n    node_selector: {tinkrl.dev/pool: sandbox}\n"
        "loss_fn_config: {clip_low_threshold: 0.7}\n"
    )
    c = load_config("s.yaml", ["wandb.entity=e", "loss_fn_config.clip_high_threshold=1.3"])
    assert c.sandbox.kubernetes.node_selector == {"tinkrl.dev/pool": "sandbox"}  # a label key, not a path
    assert (c.wandb.project, c.wandb.entity) == ("q", "e")
    assert c.loss_fn_config == {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}


def test_tinking_yaml_sections(in_tmp):
    (in_tmp / "t.yaml").write_text("env: MathConfig\noptim: {lr: 0.001}\nminitb: {}\nwandb: {project: q}\n")
    c = load_config("t.yaml", [])
    assert c.dialect == "tinking" and c.learning_rate == 0.001 and "math" in c.environments
    assert c.wandb.enabled and c.wandb.project == "q"  # tinking's W&B default merges with the file's section


def test_a_kl_toward_the_warm_start_needs_a_warm_start():
    with pytest.raises(ConfigError, match="warm_start.steps > 0"):
        load_config(None, ["env=arithmetic", "kl_penalty_coef=0.1", "kl_reference=warm_start"])
    c = load_config(None, ["env=arithmetic", "kl_reference=warm_start", "warm_start.steps=2"])
    assert c.kl_reference == "warm_start"

"""`backend: auto` is settled in one place, `backends.choose_backend`: the plan, the training loop, `tinkrl
eval` and `make_service_client` (`serve openai`, `sft`) all come to its answer, and `eval --checkpoint` asks
the engine's own path map whether the checkpoint is on this machine, without loading torch."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
import yaml
from helpers.ors import free_port

from tinkrl import backends
from tinkrl.backends import BackendUnavailable, choose_backend, make_service_client
from tinkrl.config import BackendConfig
from tinkrl.local import ServiceClient as LocalServiceClient
from tinkrl.local.checkpoint_paths import checkpoint_dir
from tinkrl.local.models import DEFAULT_MODEL, TINY_MODEL

REMOTE_MODEL = "Qwen/Qwen3-235B-A22B-Instruct-2507"  # never on this machine (HF_HUB_CACHE is empty below)

# (environment, model, what is set besides: config keys as eval's flags name them)
CASES: list[tuple[dict[str, str], str, dict[str, str]]] = [
    ({}, DEFAULT_MODEL, {}),
    ({}, REMOTE_MODEL, {}),
    ({"TINKER_API_KEY": "tml-test"}, REMOTE_MODEL, {}),
    ({"TINKER_API_KEY": "tml-test"}, DEFAULT_MODEL, {}),
    ({"TINKER_API_KEY": "tml-test", "TINKER_BASE_URL": "http://127.0.0.1:{port}"}, DEFAULT_MODEL, {}),
    ({"TINKER_API_KEY": "tml-test"}, REMOTE_MODEL, {"device": "cpu"}),
    ({}, DEFAULT_MODEL, {"backend": "tinker"}),
    ({"TINKER_API_KEY": "tml-test"}, REMOTE_MODEL, {"backend": "local"}),
]


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No Tinker key or URL from the caller, an empty HF cache, a fresh $TINKRL_HOME, and a working dir
    of its own."""
    for var in ("TINKER_API_KEY", "TINKER_BASE_URL", "WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def eval_choice(*argv: str) -> tuple[str, str]:
    """What `tinkrl eval` decides for these flags."""
    from tinkrl.commands.eval import _apply_agent_kwargs, _backend, build_parser

    parser = build_parser()
    args = parser.parse_args(list(argv))
    _apply_agent_kwargs(args, parser)
    return _backend(args)


def loop_choice(config, run_dir) -> str:
    """The backend the training loop records for `config` (its run directory's config.yaml and run.json),
    stopping before any model is loaded: the run is already trained to max_steps."""
    from tinkrl.commands.plan import make_plan
    from tinkrl.rl.train import main

    run_dir.mkdir(parents=True)
    row = {"name": "done", "batch": config.max_steps, "state_path": "x", "sampler_path": "y", "final": True}
    (run_dir / "checkpoints.jsonl").write_text(json.dumps(row) + "\n")
    assert asyncio.run(main(make_plan(config), lambda renderer, run_dir: {})) == {}
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())["backend"]
    assert json.loads((run_dir / "run.json").read_text())["identity"]["backend"] == recorded
    return recorded


def service_choice(config: BackendConfig, monkeypatch) -> str:
    """The backend `make_service_client` makes for `config` (the Tinker service is never contacted)."""

    def refuse(url: str, key: str, timeout_s: float = 0) -> None:
        raise BackendUnavailable(f"not contacted: {url}")

    monkeypatch.setattr(backends, "check_service", refuse)
    try:
        service = make_service_client(config, api_key="tml-test")
    except BackendUnavailable:
        return "tinker"
    assert isinstance(service, LocalServiceClient)
    return "local"


def test_every_command_comes_to_the_resolvers_choice(clean_env, monkeypatch):
    from tinkrl.commands.plan import make_plan
    from tinkrl.commands.train import load

    chosen = set()
    for i, (env, model, given) in enumerate(CASES):
        for var in ("TINKER_API_KEY", "TINKER_BASE_URL"):
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, value.format(port=free_port()))
        expected = choose_backend(BackendConfig(model_name=model, **given))
        chosen.add(expected[0])
        case = f"case {i}: {env} {model} {given}"

        overrides = [f"{k}={v}" for k, v in given.items()]
        config = load(None, ["env=arithmetic", f"model_name={model}", f"log_path={clean_env / f'run{i}'}", *overrides])
        plan = make_plan(config).as_dict()
        assert (plan["backend"], plan["backend_reason"]) == expected, case
        assert loop_choice(config, clean_env / f"run{i}") == expected[0], case

        flags = [f for k, v in given.items() for f in (f"--{k}", v)]
        assert eval_choice("--model", model, *flags) == expected, case

        assert service_choice(BackendConfig(model_name=model, **given), monkeypatch) == expected[0], case
    assert chosen == {"local", "tinker"}  # the cases reach both answers


def test_eval_asks_the_engines_path_map_where_a_checkpoint_is(isolated_home, monkeypatch):
    """A checkpoint the embedded engine saved is where its path map (`resolve_path`) finds it, and there
    eval looks: on this machine it stays local, key or not; elsewhere, with a key, it goes to the service."""
    from tinkrl.local.checkpoints import resolve_path

    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    tc = LocalServiceClient().create_lora_training_client(TINY_MODEL, rank=4)
    path = tc.save_weights_for_sampler("probe").result().path
    assert path.startswith("tinker://") and resolve_path(path) == checkpoint_dir(path)
    seed = ("--checkpoint", path, "--agent-kwarg", f"model_name={TINY_MODEL}")
    assert eval_choice(*seed) == ("local", f"{path} is on this machine") == choose_backend(BackendConfig(), path)
    monkeypatch.setenv("TINKER_BASE_URL", f"http://127.0.0.1:{free_port()}")  # the checkpoint still wins
    assert eval_choice(*seed)[0] == "local"

    monkeypatch.setenv("TINKRL_HOME", str(isolated_home.parent / "elsewhere"))  # the path map moves with it
    assert eval_choice(*seed) == ("tinker", f"TINKER_API_KEY is set and {path} is not on this machine")
    monkeypatch.delenv("TINKER_API_KEY")
    assert eval_choice(*seed) == ("local", "TINKER_API_KEY is not set")
    assert eval_choice(*seed, "--device", "cpu")[0] == "local"
    # a directory path is only ever the engine's to read
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    assert eval_choice("--checkpoint", str(isolated_home / "missing"))[0] == "local"


def test_the_choice_for_a_checkpoint_loads_no_torch(tmp_path):
    """Reading files and the environment only: a plan or `eval --backend auto` on the service never waits
    for the engine to load."""
    code = (
        "import sys\n"
        "from tinkrl.backends import choose_backend\n"
        "from tinkrl.config import BackendConfig\n"
        "print(choose_backend(BackendConfig(), 'tinker://run/sampler_weights/000010')[0])\n"
        "print(choose_backend(BackendConfig(model_name='Qwen/Qwen3-8B'))[0])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {"PATH": "/usr/bin:/bin", "TINKRL_HOME": str(tmp_path), "TINKER_API_KEY": "tml-test"}
    env["HF_HUB_CACHE"] = str(tmp_path / "hf")
    env["PYTHONPATH"] = ":".join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["tinker", "tinker"]

"""`tinkrl sft`: supervised steps on JSONL conversations through the Tinker API, and its input errors."""

from __future__ import annotations

import json

import pytest

from tinkrl.cli import main as tinkrl

CONVERSATIONS = [
    [
        {"role": "system", "content": "You are an agent in a Linux shell."},
        {"role": "user", "content": f"Create a directory named {name}."},
        {"role": "assistant", "content": f"```bash\nmkdir {name}\n```"},
        {"role": "user", "content": "[exit code: 0]"},
        {"role": "assistant", "content": "DONE"},
    ]
    for name in ("docs", "logs", "backups")
]


def test_sft_fits_its_conversations_and_saves_sampler_weights(tmp_path, isolated_home, capsys) -> None:
    data = tmp_path / "conv.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    log = tmp_path / "sft"
    argv = ["sft", "--data", str(data), "--model", "tinkrl/tiny-llama", "--steps", "6", "--batch-size", "3"]
    assert tinkrl(argv + ["--learning-rate", "1e-2", "--lora-rank", "8", "--log-path", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("final sampler weights: tinker://")
    rows = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    assert rows[-1]["sft/nll"] < 0.5 * rows[0]["sft/nll"]  # the same three conversations every step: it fits them
    assert all(r["sft/tokens"] == rows[0]["sft/tokens"] for r in rows)  # only the assistant turns are weighted


def test_sft_on_the_tinker_service_finishes_its_session(tmp_path, isolated_home, monkeypatch, capsys) -> None:
    """`--backend tinker`: the same steps through the SDK; the service records the session as a success."""
    from helpers.tinker_sessions import finish_reasons

    from tinkrl.local import ServiceClient
    from tinkrl.tinker_server.app import TinkerServer, serve_in_thread

    data = tmp_path / "conv.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    server = TinkerServer(ServiceClient())
    with serve_in_thread(server=server) as url:
        monkeypatch.setenv("TINKER_BASE_URL", url)
        monkeypatch.setenv("TINKER_API_KEY", "tml-local")
        argv = ["sft", "--data", str(data), "--model", "tinkrl/tiny-llama", "--steps", "1", "--batch-size", "3"]
        assert tinkrl(argv + ["--lora-rank", "4", "--backend", "tinker", "--log-path", str(tmp_path / "sft")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("final sampler weights: tinker://")
    assert finish_reasons(server) == ["success"]


def test_a_bad_line_is_one_error_naming_it(tmp_path, capsys) -> None:
    data = tmp_path / "conv.jsonl"
    data.write_text(
        json.dumps({"messages": CONVERSATIONS[0]}) + "\n" + json.dumps({"messages": [{"role": "user"}]}) + "\n"
    )
    assert tinkrl(["sft", "--data", str(data), "--model", "tinkrl/tiny-llama"]) == 2
    assert f"{data}:2: expected" in capsys.readouterr().err
    assert tinkrl(["sft", "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_model_the_engine_cannot_hold_is_one_line_naming_backend_tinker(tmp_path, isolated_home, capsys) -> None:
    """`tinkrl sft`, `tinkrl serve openai` (and `tinkrl eval`) on backend=local refuse a mixture of experts in
    one line, as `tinkrl train` does, before any weights load (the local ServiceClient checks the model)."""
    from tinkrl.errors import TinkrlError
    from tinkrl.local import ServiceClient

    data = tmp_path / "conv.jsonl"
    data.write_text(json.dumps({"messages": CONVERSATIONS[0]}) + "\n")
    model = "Qwen/Qwen3-30B-A3B"
    assert tinkrl(["sft", "--data", str(data), "--model", model, "--log-path", str(tmp_path / "sft")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tinkrl sft: the embedded engine cannot hold {model}: a mixture of experts")
    assert "backend=tinker" in err and err.count("\n") == 1
    assert tinkrl(["serve", "openai", "--model", model]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tinkrl serve openai: the embedded engine cannot hold {model}") and err.count("\n") == 1
    service = ServiceClient()
    for make in (
        lambda: service.create_sampling_client(base_model="openai/gpt-oss-20b"),
        lambda: service.create_lora_training_client(base_model="openai/gpt-oss-20b"),
    ):
        with pytest.raises(TinkrlError, match=r"cannot hold openai/gpt-oss-20b: .*backend=tinker"):
            make()

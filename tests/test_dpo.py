"""DPO: the loss and its gradient against the formula, the pair layouts and their errors, pairs from a run's
own groups, and `tinkrl dpo` end to end (resume, dry run, the Tinker SDK's client-side custom loss)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers.engine import (
    TEST_DTYPE,
    TINY,
    assert_close_vectors,
    datum,
    flat,
    logprobs_of,
    lora_grads,
    randomize_lora,
    zero_grads,
)

from tinkrl.cli import main as tinkrl
from tinkrl.errors import ConfigError
from tinkrl.local import ServiceClient
from tinkrl.rl.dpo import batch_indices
from tinkrl.rl.preference import (
    completion_logprob,
    dpo_loss,
    load_pairs,
    pair_datums,
    pairs_from_run,
    reference_logprobs,
)

BETA = 0.5


def _pair_datums(n_pairs: int) -> list:
    """Chosen, rejected, ... over a shared 4-token prompt; weight 1 on the completion's targets."""
    out = []
    for i in range(n_pairs):
        prompt = [1, 40 + i, 41, 42]
        for side in range(2):
            completion = [100 + 13 * i + 7 * side + k for k in range(3 + side)]
            tokens = prompt + completion
            out.append(datum(tokens, weights=[0.0] * (len(prompt) - 1) + [1.0] * len(completion)))
    return out


@pytest.fixture(scope="module")
def tc():
    client = ServiceClient(dtype=TEST_DTYPE).create_lora_training_client(TINY, rank=4, seed=0)
    randomize_lora(client, scale=0.05, seed=3)
    return client


def test_dpo_loss_and_gradient_match_the_formula(tc):
    """The loss `forward_backward_custom` reports equals DPO's formula on the model's own logprobs, and its
    gradient equals the formula's: d/dlogpi(chosen) = -beta*sigmoid(-m)/P, d/dlogpi(rejected) the opposite,
    applied here through the engine's cross_entropy with those weights (an independent path)."""
    data = _pair_datums(3)
    lps = logprobs_of(tc.forward(data, "cross_entropy").result())
    policy = np.array([float((lp * d.loss_fn_inputs["weights"].to_numpy()).sum()) for lp, d in zip(lps, data)])
    refs = list(policy + np.array([0.5, -0.5, -1.0, 1.0, 0.3, 0.2]))  # margins of both signs
    rewards = BETA * (policy - np.array(refs))
    margin = rewards[0::2] - rewards[1::2]
    expected = float(np.mean(np.log1p(np.exp(-margin))))  # -log sigmoid(m)
    assert (margin > 0).any() and (margin < 0).any(), "pairs on both sides of 0, so accuracy can be wrong"

    zero_grads(tc)
    out = tc.forward_backward_custom(data, dpo_loss(BETA, refs)).result()
    custom_grad = flat(lora_grads(tc))
    assert out.metrics["dpo/loss"] == pytest.approx(expected, rel=1e-4)
    assert out.metrics["dpo/margin"] == pytest.approx(float(margin.mean()), rel=1e-4, abs=1e-6)
    assert out.metrics["dpo/accuracy"] == pytest.approx(float((margin > 0).mean()))
    assert out.metrics["dpo/chosen_reward"] == pytest.approx(float(rewards[0::2].mean()), rel=1e-4)

    coef = BETA / (1.0 + np.exp(margin)) / len(margin)  # beta * sigmoid(-m) / P
    weighted = []
    for i, d in enumerate(data):
        sign = 1.0 if i % 2 == 0 else -1.0
        w = d.loss_fn_inputs["weights"].to_numpy() * sign * coef[i // 2]
        weighted.append(datum(d.model_input.to_ints() + [int(d.loss_fn_inputs["target_tokens"].data[-1])], weights=w))
    zero_grads(tc)
    tc.forward_backward(weighted, "cross_entropy").result()
    formula_grad = flat(lora_grads(tc))
    zero_grads(tc)
    assert_close_vectors(custom_grad, formula_grad, rel=2e-3)


def test_reference_logprobs_are_the_completion_tokens_under_the_reference():
    """`compute_logprobs` over the whole sequence, summed on the weighted targets: the same figure the
    training forward gives for a fresh LoRA (which is the base model)."""
    service = ServiceClient(dtype=TEST_DTYPE)
    data = _pair_datums(2)
    fresh = service.create_lora_training_client(TINY, rank=4, seed=0)
    lps = logprobs_of(fresh.forward(data, "cross_entropy").result())
    want = [float((lp * d.loss_fn_inputs["weights"].to_numpy()).sum()) for lp, d in zip(lps, data)]
    import asyncio

    got = asyncio.run(reference_logprobs(service.create_sampling_client(base_model=TINY), data))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    assert completion_logprob([None, -1.0, -2.0, -3.0], datum([5, 6, 7, 8], weights=[0.0, 1.0, 1.0])) == -5.0


def _write(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_the_fields_common_layouts_read_as_the_same_pair(tmp_path):
    q = "What is 2 + 2?"
    layouts = [
        {"prompt": q, "chosen": "4", "rejected": "5"},
        {"prompt": [{"role": "user", "content": q}], "chosen": {"role": "assistant", "content": "4"}, "rejected": "5"},
        {  # UltraFeedback (binarized): both sides repeat the prompt
            "prompt": q,
            "chosen": [{"role": "user", "content": q}, {"role": "assistant", "content": "4"}],
            "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": "5"}],
        },
        {"chosen": f"\n\nHuman: {q}\n\nAssistant: 4", "rejected": f"\n\nHuman: {q}\n\nAssistant: 5"},  # HH-RLHF
        {"conversation": [{"role": "user", "content": q}], "chosen": "4", "rejected": "5"},
    ]
    pairs = load_pairs(_write(tmp_path / "p.jsonl", layouts))
    assert len(pairs) == len(layouts)
    for p in pairs:
        assert p.prompt == [{"role": "user", "content": q}]
        assert (p.chosen["content"], p.rejected["content"]) == ("4", "5")
    assert pairs[3].source.endswith("p.jsonl:4")
    hh = load_pairs(
        _write(
            tmp_path / "hh.jsonl",
            [{"chosen": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: and?\n\nAssistant: yes",
              "rejected": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: and?\n\nAssistant: no"}],
        )
    )[0]  # fmt: skip
    assert [m["role"] for m in hh.prompt] == ["user", "assistant", "user"] and hh.rejected["content"] == "no"


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ({"prompt": "q", "chosen": "a"}, 'missing "rejected"'),
        ({"prompt": "q", "chosen": "a", "rejected": "   "}, '"rejected" is an empty completion'),
        ({"chosen": "a", "rejected": "b"}, 'missing "prompt"'),
        ({"prompt": "q", "chosen": 3, "rejected": "b"}, '"chosen" must be a string, a message or a list'),
        ("{not json", "not JSON"),
    ],
)
def test_a_bad_record_is_one_error_naming_it(tmp_path, record, says):
    path = _write(tmp_path / "bad.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}, record])
    with pytest.raises(ConfigError, match="bad.jsonl:2: ") as e:
        load_pairs(path)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_missing_file_or_empty_one_says_so(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_pairs(str(tmp_path / "none.jsonl"))
    with pytest.raises(ConfigError, match="no pairs"):
        load_pairs(_write(tmp_path / "empty.jsonl", [""]))


def _fake_run(tmp_path, model="M"):
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "config.yaml").write_text(f"model_name: {model}\n")
    rows = []
    for step, rewards in ((1, [1.0, 0.0, -0.1]), (2, [1.0, 1.0, 1.0])):
        for k, r in enumerate(rewards):
            rows.append({"env": "a", "prompt": "P", "reward": r, "tokens": [1, 2, 3, 10 + k], "mask": [0, 0, 0, 1]})
        (run / "rollouts" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        rows = []
    return run


def test_pairs_from_a_run_are_its_best_and_worst_rollouts(tmp_path):
    run = _fake_run(tmp_path)
    (pair,) = pairs_from_run(run, "M")  # step 2's group is constant: no pair
    assert pair.chosen == ([1, 2, 3, 10], [0.0, 0.0, 0.0, 1.0]) and pair.rejected == (
        [1, 2, 3, 12],
        [0.0, 0.0, 0.0, 1.0],
    )
    each = pairs_from_run(run, "M", each=True)  # the best over each rollout rewarded below it
    assert [p.rejected[0][-1] for p in each] == [11, 12] and all(p.chosen == pair.chosen for p in each)
    with pytest.raises(ConfigError, match="sampled M, but this run trains N"):
        pairs_from_run(run, "N")
    (run / "rollouts" / "step_000001.jsonl").unlink()
    with pytest.raises(ConfigError, match="no group whose rollouts' rewards differ"):
        pairs_from_run(run, "M")
    with pytest.raises(ConfigError, match="has no tokens within dpo.max_length=2"):
        pair_datums(pairs_from_run(_fake_run(tmp_path / "x"), "M"), max_length=2)


def test_batches_are_known_from_the_step_and_cover_every_pair_each_pass():
    n, b = 10, 4
    steps = [batch_indices(n, b, s, seed=1) for s in range(5)]
    flat_ = [i for s in steps for i in s]
    assert sorted(flat_[:10]) == list(range(10)) and sorted(flat_[10:20]) == list(range(10))
    assert steps[3] == batch_indices(n, b, 3, seed=1) and steps[0] != batch_indices(n, b, 0, seed=2)


PAIRS = [
    {"prompt": f"Name a colour number {i}.", "chosen": f"Blue {i}.", "rejected": f"I will not say {i}."}
    for i in range(6)
]


def _argv(tmp_path, *extra: str) -> list[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    pairs = _write(tmp_path / "pairs.jsonl", PAIRS)
    return ["dpo", f"dpo.pairs={pairs}", f"model_name={TINY}", "lora_rank=4", "batch_size=3", "learning_rate=5e-2",
            "dpo.beta=0.5", "save_every=1", f"log_path={tmp_path / 'run'}", "backend=local", *extra]  # fmt: skip


def _rows(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_tinkrl_dpo_learns_its_pairs_and_resumes(tmp_path, isolated_home, capsys):
    assert tinkrl(_argv(tmp_path, "max_steps=8")) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: DPO on ") and out.strip().splitlines()[-2].startswith("final sampler weights: ")
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == list(range(8))
    assert rows[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-3)  # a fresh LoRA is the reference
    assert rows[-1]["dpo/loss"] < 0.5 * rows[0]["dpo/loss"] and rows[-1]["dpo/accuracy"] == 1.0
    assert rows[-1]["dpo/margin"] > 0
    assert tinkrl(_argv(tmp_path, "max_steps=10")) == 0
    out = capsys.readouterr().out
    assert "resuming " in out and "reference base read from" in out
    assert [r["step"] for r in _rows(tmp_path)] == list(range(10))


def test_dry_run_shows_the_dpo_section_and_train_refuses_pairs(tmp_path, capsys):
    assert tinkrl([*_argv(tmp_path, "max_steps=2"), "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dpo"]["beta"] == 0.5 and plan["dpo"]["reference"] == "base" and plan["environments"] == {}
    assert tinkrl(["train", *_argv(tmp_path)[1:]]) == 2
    assert "dpo.pairs are preference pairs for tinkrl dpo" in capsys.readouterr().err
    assert tinkrl(["dpo", "env=arithmetic"]) == 2
    assert "tinkrl dpo needs dpo.pairs" in capsys.readouterr().err
    assert tinkrl([*_argv(tmp_path, "dpo.reference=./nowhere")]) == 2
    assert "dpo.reference: no run directory or checkpoint at" in capsys.readouterr().err


def test_a_bad_pair_stops_the_command_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import tinkrl.rl.run_setup as run_setup

    monkeypatch.setattr(run_setup, "make_service_client", lambda *_: pytest.fail("a model was loaded"))
    bad = _write(tmp_path / "bad.jsonl", [PAIRS[0], {"prompt": "q", "chosen": "", "rejected": "b"}])
    assert tinkrl([*_argv(tmp_path), f"dpo.pairs={bad}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f'tinkrl dpo: error: {bad}:2: "chosen" is an empty completion'


def test_through_the_tinker_sdk_the_client_side_loss_trains_the_same(tmp_path, isolated_home, monkeypatch, capsys):
    """backend=tinker against `tinkrl serve tinker`: the SDK runs the DPO loss client-side on `forward`'s
    logprobs; the steps' losses are those of the same run on the embedded engine."""
    from tinkrl.tinker_server.app import TinkerServer, serve_in_thread

    assert tinkrl(_argv(tmp_path / "local", "max_steps=3")) == 0
    local = _rows(tmp_path / "local")
    with serve_in_thread(server=TinkerServer(ServiceClient())) as url:
        monkeypatch.setenv("TINKER_BASE_URL", url)
        monkeypatch.setenv("TINKER_API_KEY", "tml-local")
        argv = [a if a != "backend=local" else "backend=tinker" for a in _argv(tmp_path / "remote", "max_steps=3")]
        assert tinkrl(argv) == 0
    remote = _rows(tmp_path / "remote")
    capsys.readouterr()
    for a, b in zip(local, remote, strict=True):
        assert b["dpo/loss"] == pytest.approx(a["dpo/loss"], rel=2e-2, abs=2e-3)
    assert remote[-1]["dpo/loss"] < remote[0]["dpo/loss"]

"""On-policy distillation: the advantage is the reverse KL to the teacher token by token (checked against
the teacher's own forward pass on a tiny model), its options (discount, coefficients), `teacher=` in the
config, the plan's resolution of run directories and checkpoints, the refusal of a teacher with another
tokenizer before any work, and `tinkrl train` distilling end to end and resuming."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.engine import TINY, datum, logprobs_of, randomize_lora, real_models_dir
from tinker import types

from tinkrl.config import load_config
from tinkrl.errors import ConfigError
from tinkrl.local.compute_plan import AGREEMENT_BOUND
from tinkrl.rl.data import SequenceData, add_kl_penalty, build_sequences, discounted_sums
from tinkrl.rl.teacher import Teacher, resolve_teacher, token_problem
from tinkrl.rl.types import Trajectory, TrajectoryGroup, Transition


def _student_samples(sampler, prompt: list[int], n: int) -> list[SequenceData]:
    """`n` sequences the student samples after `prompt`: prompt tokens masked out, sampled ones trained."""
    resp = sampler.sample(types.ModelInput.from_ints(prompt), n, types.SamplingParams(max_tokens=6, seed=3)).result()
    seqs = []
    for s in resp.sequences:
        tokens = prompt + list(s.tokens)
        zeros = [0.0] * len(prompt)
        seqs.append(SequenceData(tokens, zeros + list(s.logprobs), [0.0] * len(tokens), zeros + [1.0] * len(s.tokens)))
    return seqs


def test_advantage_is_the_reverse_kl_to_the_teacher_token_by_token():
    from tinkrl.local import ServiceClient

    service = ServiceClient(device="cpu", dtype="float32")
    teacher_tc = service.create_lora_training_client(TINY, rank=4, seed=1)
    randomize_lora(teacher_tc, scale=0.1, seed=1)  # the teacher: the tiny model with a live adapter
    teacher = teacher_tc.save_weights_and_get_sampling_client()
    student = service.create_sampling_client(base_model=TINY)
    prompt = teacher_tc.get_tokenizer().encode("What is 17 + 25? The answer is")
    seqs = _student_samples(student, prompt, 3)
    metrics = asyncio.run(add_kl_penalty(seqs, teacher, 1.0, "teacher", centred=False))

    # the teacher's logprobs of the same tokens from its trainer's forward pass (another code path)
    weights = [np.ones(len(s.tokens) - 1) for s in seqs]
    data = [datum(s.tokens, weights=w) for s, w in zip(seqs, weights)]
    fwd = teacher_tc.forward(data, "cross_entropy").result()
    kls = []
    for s, teacher_lp in zip(seqs, logprobs_of(fwd)):
        for i in range(len(prompt), len(s.tokens)):
            reverse_kl = s.logprobs[i] - teacher_lp[i - 1]  # student minus teacher on the student's sample
            assert s.advantages[i] == pytest.approx(-reverse_kl, abs=AGREEMENT_BOUND)
            kls.append(reverse_kl)
        assert all(a == 0.0 for a in s.advantages[: len(prompt)])  # the prompt is not trained
    assert np.mean(np.abs(kls)) > 10 * AGREEMENT_BOUND  # the teacher really differs from the student
    assert metrics["kl_policy_teacher"] == pytest.approx(np.mean(kls), abs=AGREEMENT_BOUND)
    assert metrics["logprob/policy"] - metrics["logprob/teacher"] == pytest.approx(metrics["kl_policy_teacher"])

    # a coefficient scales it; a discount adds the later tokens' terms, discounted
    again = [SequenceData(list(s.tokens), list(s.logprobs), [0.0] * len(s.tokens), list(s.mask)) for s in seqs]
    asyncio.run(add_kl_penalty(again, teacher, 2.0, "teacher", centred=False, discount=0.5))
    for s, a in zip(seqs, again):
        d = [-x for x in s.advantages]
        expected = [-2.0 * v * m for v, m in zip(discounted_sums(d, 0.5), s.mask)]
        assert a.advantages == pytest.approx(expected, abs=1e-9)
        assert a.advantages[len(prompt)] != pytest.approx(2 * s.advantages[len(prompt)], abs=1e-6)


def test_discounted_sums():
    assert discounted_sums([1.0, 2.0, 4.0], 0.5) == [1.0 + 1.0 + 1.0, 2.0 + 2.0, 4.0]
    assert discounted_sums([1.0, 2.0], 0.0) == [1.0, 2.0]


def _group(rewards: list[float]) -> TrajectoryGroup:
    ob = types.ModelInput.from_ints([1, 2, 3])
    trajs = [Trajectory([Transition(ob, [4, 5], [-0.5, -0.5], r, True)]) for r in rewards]
    return TrajectoryGroup(trajs, [0.0] * len(rewards), [{} for _ in rewards], ["t"])


def test_reward_coef_weights_the_reward_advantages():
    groups = [("arithmetic", _group([1.0, 0.0, 0.0, 1.0]))]
    full = [s.advantages for s, _ in build_sequences(groups, "grpo", 2.0)]
    half = [s.advantages for s, _ in build_sequences(groups, "grpo", 2.0, reward_coef=0.5)]
    none = [s.advantages for s, _ in build_sequences(groups, "grpo", 2.0, reward_coef=0.0)]
    assert any(a != 0 for adv in full for a in adv)
    assert half == [[0.5 * a for a in adv] for adv in full]
    assert all(a == 0 for adv in none for a in adv)


def test_teacher_in_the_config():
    c = load_config(None, ["env=arithmetic", "teacher=runs/arithmetic", "teacher.kl_discount_factor=0.9"])
    assert c.teacher.model == "runs/arithmetic" and c.teacher.kl_discount_factor == 0.9
    assert c.teacher.kl_coef == 1.0 and c.teacher.reward_coef == 0.0
    assert load_config(None, ["env=arithmetic"]).teacher.model is None
    with pytest.raises(ConfigError, match="kl_discount_factor"):
        load_config(None, ["env=arithmetic", "teacher=x", "teacher.kl_discount_factor=1"])
    with pytest.raises(ConfigError, match="teacher.kl_cof"):
        load_config(None, ["env=arithmetic", "teacher.kl_cof=1"])


def test_the_plan_resolves_run_directories_and_checkpoints(tmp_path, monkeypatch):
    from tinkrl.config import TeacherConfig

    monkeypatch.setenv("TINKRL_HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"model_name: {TINY}\n")
    (run / "checkpoints.jsonl").write_text("")
    with pytest.raises(ConfigError, match="has no checkpoint yet"):
        resolve_teacher(TeacherConfig(model=str(run)))
    rows = [{"name": f"{n:06d}", "batch": n, "sampler_path": f"tinker://r/sampler_weights/{n:06d}"} for n in (1, 2)]
    (run / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = resolve_teacher(TeacherConfig(model=str(run)))
    assert t == Teacher(TINY, "tinker://r/sampler_weights/000002", str(run), False)
    assert "teacher " in t.line() and TINY in t.line()

    ckpt = tmp_path / "home" / "checkpoints" / "r" / "sampler_weights" / "000002"
    ckpt.mkdir(parents=True)
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        resolve_teacher(TeacherConfig(model="tinker://r/sampler_weights/000002"))
    (ckpt / "tinkrl_meta.json").write_text(json.dumps({"base_model": "Qwen/Qwen3-8B"}))
    t = resolve_teacher(TeacherConfig(model="tinker://r/sampler_weights/000002"))
    assert t.local and t.base_model == "Qwen/Qwen3-8B" and t.model_path == "tinker://r/sampler_weights/000002"
    hosted = resolve_teacher(TeacherConfig(model="tinker://elsewhere/sampler_weights/final"))
    assert not hosted.local and hosted.base_model is None
    assert resolve_teacher(TeacherConfig(model="Qwen/Qwen3-8B")) == Teacher(
        "Qwen/Qwen3-8B", None, "Qwen/Qwen3-8B", False
    )
    assert resolve_teacher(TeacherConfig()) is None
    with pytest.raises(ConfigError, match="no run directory or checkpoint at"):
        resolve_teacher(TeacherConfig(model=str(tmp_path / "nothing")))


def test_token_problem():
    def named(model: str | None) -> Teacher:
        return Teacher(model, None, model or "tinker://x/sampler_weights/final", False)

    student = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert token_problem(student, named(student)) is None
    assert token_problem(student, named(TINY)) is None  # the tiny models use SmolLM2's tokenizer (files on disk)
    assert token_problem("Qwen/Qwen3-8B", named("Qwen/Qwen3-8B-Base")) is None  # one family by name
    assert "tokenize differently" in token_problem(student, named("Qwen/Qwen3-8B"))
    assert "cannot tell whether" in token_problem(student, named("someone/some-model"))
    assert "set teacher.base_model" in token_problem(student, named(None))


def _tinkrl(home: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TINKRL_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "tinkrl.cli", "train", "env=arithmetic", f"model_name={TINY}", *argv]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_train_distils_from_a_run_and_resumes(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(real_models_dir(), target_is_directory=True)
    common = ["max_tokens=6", "eval_problems=4", "eval_every=0", "save_every=1"]
    out = _tinkrl(
        home, tmp_path, *common, "batch_size=8", "group_size=4", "max_steps=2", "learning_rate=1e-2", "run_name=teacher"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    teacher_run = tmp_path / "runs" / "teacher"

    # a teacher with another tokenizer is refused before any work: no run directory is made
    refused = _tinkrl(home, tmp_path, *common, "teacher=Qwen/Qwen3-8B", "run_name=wrong")
    assert refused.returncode == 2 and "tokenize differently" in refused.stdout + refused.stderr
    assert not (tmp_path / "runs" / "wrong").exists()

    distil = [*common, f"teacher={teacher_run}", "batch_size=4", "group_size=1", "run_name=student"]
    out = _tinkrl(home, tmp_path, *distil, "max_steps=2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"distils from teacher {teacher_run}" in out.stdout
    student = tmp_path / "runs" / "student"
    out = _tinkrl(home, tmp_path, *distil, "max_steps=3")  # resumes at step 2
    assert out.returncode == 0, out.stdout + out.stderr
    metrics = [json.loads(line) for line in (student / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in metrics:
        assert {"kl_policy_teacher", "logprob/teacher", "logprob/policy", "time/teacher"} <= set(m)
        assert m["env/all/total_episodes"] == 4  # every sample trains: no group is dropped for its reward
    assert metrics[0]["kl_policy_teacher"] > 0  # the teacher, trained, differs from the untrained student
    # reward_coef 0: the reward's advantage is left out of every trained sequence
    rollouts = [json.loads(line) for line in (student / "rollouts" / "step_000000.jsonl").read_text().splitlines()]
    assert len(rollouts) == 4 and all(r["advantage"] == 0.0 for r in rollouts)
    last = [json.loads(line) for line in (student / "checkpoints.jsonl").read_text().splitlines()][-1]
    assert last["batch"] == 3 and last["final"]

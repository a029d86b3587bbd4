"""Evaluation that leaves the budget to learning: the in-run eval's fixed sample, standard errors, the
base model's eval kept on disk, the job's clock (step pace from the start of RL, the final eval's
reserve, the cap on evaluation's share) and the run's summary of what each phase gained."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
import tinker
from helpers.sampled import response_of
from tinker import types

from tinkrl.config import load_config
from tinkrl.errors import ConfigError
from tinkrl.rl.evaluation import evaluate, fixed_sample, mean_and_stderr
from tinkrl.rl.schedule import TimeBudget
from tinkrl.rl.summary import gains, problem_changes, run_summary, summary_lines
from tinkrl.rl.types import Env, EnvDatasets, EnvGroupBuilder, RLDataset, StepResult
from tinkrl.rl.warm_start import base_eval


class Scored(Env):
    """One turn; reward 1 when the episode is greedy and the problem is `easy`, else 0 (sampled episodes
    always score `sampled_reward`), so greedy and sampled means differ."""

    def __init__(self, easy: bool, sampled_reward: float):
        self.easy, self.sampled_reward = easy, sampled_reward

    async def initial_observation(self):
        return tinker.ModelInput.from_ints([1, 2]), [0]

    async def step(self, action, *, stop_reason="stop"):
        reward = float(self.easy) if not action else self.sampled_reward
        return StepResult(reward, True, tinker.ModelInput.empty(), [0])


class Problem(EnvGroupBuilder):
    def __init__(self, name: str, tag: str, easy: bool, sampled_reward: float = 0.5, keyed: bool = True):
        self.name, self.tag, self.easy, self.sampled_reward, self.keyed = name, tag, easy, sampled_reward, keyed

    async def make_envs(self):
        return [Scored(self.easy, self.sampled_reward)]

    def logging_tags(self):
        return [self.tag]

    def eval_key(self):
        return self.name if self.keyed else None


class Fixed(RLDataset):
    def __init__(self, builders):
        self.builders = builders

    def get_batch(self, index):
        return list(self.builders)

    def __len__(self):
        return 1


class CountingSampler:
    """Greedy requests get no tokens, sampled ones one; counts the episodes it played."""

    def __init__(self):
        self.calls = 0

    async def sample(self, prompt, num_samples, params: types.SamplingParams):
        self.calls += 1
        return response_of(0 if params.temperature == 0 else 1)


def problems(keyed: bool = True) -> list[Problem]:
    """12 generated held-out problems (8 solved greedily) and 4 hand-written ones (1 solved)."""
    generated = [Problem(f"g{i}", "heldout_instances", i < 8, keyed=keyed) for i in range(12)]
    written = [Problem(f"w{i}", "handwritten", i == 0, keyed=keyed) for i in range(4)]
    return generated + written


def envs_of(builders) -> dict[str, EnvDatasets]:
    return {"shell": EnvDatasets(train=Fixed([]), test=Fixed(builders))}


def test_mean_and_stderr() -> None:
    assert mean_and_stderr([1.0, 0.0, 1.0, 0.0]) == pytest.approx((0.5, np.std([1, 0, 1, 0], ddof=1) / 2))
    mean, se = mean_and_stderr([1.0])
    assert mean == 1.0 and np.isnan(se)
    assert all(np.isnan(x) for x in mean_and_stderr([]))


def test_the_in_run_sample_is_fixed_and_spread_over_the_tags() -> None:
    builders = problems()
    sample = fixed_sample(builders, 8, seed=3, key="shell")
    assert [b.name for b in sample] == [b.name for b in fixed_sample(builders, 8, seed=3, key="shell")]
    assert [b.name for b in sample] != [b.name for b in fixed_sample(builders, 8, seed=4, key="shell")]
    tags = [b.tag for b in sample]
    assert tags.count("heldout_instances") == 6 and tags.count("handwritten") == 2  # 12:4 of 8
    assert [builders.index(b) for b in sample] == sorted(builders.index(b) for b in sample)  # original order
    assert len({b.name for b in fixed_sample(builders, 2, 0, "shell")} & {"w0", "w1", "w2", "w3"}) == 1
    assert fixed_sample(builders, 50, 0, "shell") == builders


def test_full_and_sample_evals_report_means_with_standard_errors() -> None:
    sampler = CountingSampler()
    full = asyncio.run(evaluate(envs_of(problems()), sampler, 8, 1.0))
    assert sampler.calls == 2 * 16  # every problem, greedy and sampled
    assert full["eval/shell/greedy_reward"] == pytest.approx(9 / 16)
    assert full["eval/shell/heldout_instances/greedy_reward"] == pytest.approx(8 / 12)
    assert full["eval/shell/handwritten/greedy_reward"] == pytest.approx(1 / 4)
    assert full["eval/shell/sampled_reward"] == pytest.approx(0.5) and full["eval/shell/sampled_reward_stderr"] == 0
    se = np.std([1.0] * 8 + [0.0] * 4, ddof=1) / np.sqrt(12)
    assert full["eval/shell/heldout_instances/greedy_reward_stderr"] == pytest.approx(se)

    sampler = CountingSampler()
    greedy_only = asyncio.run(evaluate(envs_of(problems()), sampler, 8, 1.0, modes=["greedy"]))
    assert sampler.calls == 16 and not any("sampled" in k for k in greedy_only)

    rows: list[dict] = []
    sampler, held_out = CountingSampler(), problems()
    sample = asyncio.run(evaluate(envs_of(held_out), sampler, 8, 1.0, sample_size=8, seed=1, rows=rows))
    assert sampler.calls == 8  # the sample, greedy only
    # one row per episode, each naming its problem's place in the whole held-out set
    chosen = [held_out.index(b) for b in fixed_sample(held_out, 8, 1, "shell")]
    assert [r["problem"] for r in rows] == chosen and {r["mode"] for r in rows} == {"greedy"}
    assert [r["reward"] for r in rows] == [float(i < 8 or i == 12) for i in chosen]
    assert [r["tag"] for r in rows] == ["heldout_instances" if i < 12 else "handwritten" for i in chosen]
    assert set(sample) == {
        f"eval_sample/shell/{part}greedy_reward{se}"
        for part in ("", "heldout_instances/", "handwritten/")
        for se in ("", "_stderr")
    }


class Phases:
    """Stands in for the run logger: keeps the warm_start.jsonl lines."""

    def __init__(self):
        self.rows: list[dict] = []

    def write_phase(self, row: dict) -> None:
        self.rows.append(row)


def test_the_base_models_eval_is_kept_and_read_back(isolated_home) -> None:
    config = load_config(None, ["env=arithmetic", "warm_start.steps=2", "eval_modes=[greedy]"])
    budget = TimeBudget(None, time.time())
    sampler, phases = CountingSampler(), Phases()
    first = asyncio.run(base_eval(config, envs_of(problems()), sampler, phases, budget))
    assert sampler.calls == 16 and phases.rows[0]["cached"] is False
    again = asyncio.run(base_eval(config, envs_of(problems()), sampler, phases, budget))
    assert sampler.calls == 16 and again == first and phases.rows[1]["cached"] is True
    assert (
        phases.rows[1]["phase"] == "base"
        and phases.rows[1]["eval/shell/greedy_reward"] == first["eval/shell/greedy_reward"]
    )
    # another held-out set, other settings, a sample, or builders that cannot name themselves: evaluated
    changed = problems()
    changed[0].name = "other"
    for cfg, builders in (
        (config, changed),
        (load_config(None, ["env=arithmetic", "warm_start.steps=2", "max_tokens=16"]), problems()),
        (config, problems(keyed=False)),
        (config, problems(keyed=False)),
    ):
        before = sampler.calls
        asyncio.run(base_eval(cfg, envs_of(builders), sampler, phases, budget))
        assert sampler.calls > before
    sample = load_config(
        None, ["env=arithmetic", "warm_start.steps=2", "warm_start.base_eval=sample", "eval_sample_size=4"]
    )
    before = sampler.calls
    asyncio.run(base_eval(sample, envs_of(problems()), sampler, phases, budget))
    assert sampler.calls == before + 4 and phases.rows[-1]["kind"] == "sample"
    assert "eval/base" in budget.spent


def test_eval_keys_are_checked() -> None:
    for bad, match in (
        (["eval_modes=[greedy, greedy]"], "each mode once"),
        (["eval_modes=[beam]"], "eval_modes"),
        (["eval_max_share=1.5"], "eval_max_share"),
        (["warm_start.base_eval=sample"], "eval_sample_size"),
        (["eval_sample=24"], "eval_sample"),
        (["eval_sample_size=0"], "eval_sample_size"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config(None, ["env=arithmetic", *bad])


def test_the_step_pace_starts_with_rl_and_leaves_full_evals_out(monkeypatch) -> None:
    """Loading, a base eval and the warm start took 600 s of a 1000 s budget; RL's first step took 10 s
    besides a 30 s full eval. The pace is 10 s a step, not (640 - 30) s, and 30 s stay reserved for the
    final eval: (1000 - 640 - 30) / 10 steps fit."""
    now = [0.0]
    monkeypatch.setattr("tinkrl.rl.schedule.time.time", lambda: now[0])
    budget = TimeBudget(1000.0, t0=0.0, eval_share=0.2)
    now[0] = 100.0
    budget.note("eval/base", 100.0)
    now[0] = 600.0
    budget.note("warm_start", 500.0)
    budget.start_rl()
    now[0] = 630.0
    budget.note("eval/before_rl", 30.0)
    now[0] = 640.0
    budget.note_step(1)
    assert budget.steps_left(1) == pytest.approx((1000 - 640 - 30) / 10)
    assert not budget.exhausted(1)
    # evaluation so far 130 s, the final eval's reserve 30 s: a 10 s sample fits in 200 s, a 50 s one does not
    budget.note("eval/sample", 10.0)
    assert budget.eval_fits(sample=True) and budget.eval_spent == 140.0
    budget.note("eval/sample", 25.0)
    assert not budget.eval_fits(sample=True)
    assert TimeBudget(1000.0, 0.0).eval_fits(sample=True)  # no share: no cap
    resumed = TimeBudget(1000.0, t0=0.0)
    resumed.expect_final_eval(30.0)  # the recorded eval before RL, until this process measures one
    assert resumed.eval_s == 30.0
    resumed.note("eval/final", 20.0)
    assert resumed.eval_s == 20.0


def test_the_summary_shows_each_phases_gain_and_the_time_split(tmp_path, monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr("tinkrl.rl.schedule.time.time", lambda: now[0])
    monkeypatch.setattr("tinkrl.rl.summary.time.time", lambda: now[0])
    base = {"phase": "base", "kind": "sample", "cached": True, "eval_sample/shell/greedy_reward": 0.0}
    base["eval_sample/shell/greedy_reward_stderr"] = 0.0
    (tmp_path / "warm_start.jsonl").write_text(json.dumps(base) + "\n")
    before = {"eval/shell/greedy_reward": 0.5, "eval/shell/greedy_reward_stderr": 0.03}
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, **before}) + "\n")
    after = {"eval/shell/greedy_reward": 0.8, "eval/shell/greedy_reward_stderr": 0.04}
    budget = TimeBudget(1000.0, 0.0)
    budget.note("eval/base", 0.5)
    budget.note("warm_start", 300.0)
    budget.note("eval/before_rl", 50.0)
    budget.note("rl", 500.0)
    budget.note("eval/final", 49.5)
    now[0] = 1000.0
    summary = run_summary(tmp_path, budget, 40, None, after)  # before RL read back from metrics.jsonl
    rl = summary["gain"]["rl"]["shell/greedy_reward"]
    assert rl["gain"] == pytest.approx(0.3) and rl["stderr"] == pytest.approx(0.05)
    assert summary["gain"]["warm_start"]["shell/greedy_reward"]["gain"] == pytest.approx(0.5)
    assert summary["base_eval"] == {"cached": True, "kind": "sample"} and summary["rl_steps"] == 40
    t = summary["time"]
    assert t["eval_s"] == 100.0 and t["eval_share"] == 0.1 and t["setup_s"] == 100.0 and t["total_s"] == 1000.0
    lines = summary_lines(summary)
    assert lines[1] == "rl: shell/greedy_reward 0.500 -> 0.800 (+0.300 ± 0.050)"
    assert "evaluation 10% of it" in lines[-1]
    assert gains({"a": 1.0}, {"b": 2.0}) == {}


def test_the_summary_names_the_problems_rl_solved_and_lost() -> None:
    def row(tag: str, name: str | None, problem: int, reward: float | None) -> dict:
        named = {"tasks/task": name} if name else {}
        return {"env": "shell", "problem": problem, "tag": tag, "mode": "greedy", "reward": reward, **named}

    before = [row("handwritten", "a", 0, 1.0), row("handwritten", "b", 1, 0.0), row("handwritten", "c", 2, 0.0)]
    before += [row("heldout_instances", None, 3, 1.0), row("heldout_instances", None, 4, None)]
    after = [row("handwritten", "a", 0, 0.0), row("handwritten", "b", 1, 1.0), row("handwritten", "c", 2, 1.0)]
    after += [row("heldout_instances", None, 3, 1.0), row("heldout_instances", None, 4, 1.0)]
    changes = problem_changes(before, after)
    assert changes["handwritten"] == {"of": 3, "before": 1, "after": 2, "gained": ["b", "c"], "lost": ["a"]}
    # an infrastructure failure (reward None) counts as not solved
    assert changes["heldout_instances"] == {"of": 2, "before": 1, "after": 2, "gained": ["shell#4"], "lost": []}
    assert problem_changes(before, after[:1])["handwritten"]["of"] == 1  # only problems both evals played


def test_the_summary_says_what_the_sandbox_provider_did() -> None:
    """A provider that counts (harbor) gets a line and a `sandboxes` entry; one never made, or one that keeps
    no counts (bwrap), adds nothing."""
    from tinkrl.rl.summary import sandbox_counts
    from tinkrl.sandbox import LazyProvider, get_provider

    unused, bwrap = LazyProvider(), LazyProvider(get_provider("bwrap"))
    bwrap.get()
    envs = {k: EnvDatasets(train=None, sandboxes=p.summary) for k, p in (("a", unused), ("b", bwrap))}  # type: ignore[arg-type]
    assert sandbox_counts(envs) == {}
    counted = {"provider": "harbor", "started": 12, "failed": 1, "retried": 2}
    assert sandbox_counts({"c": EnvDatasets(train=None, sandboxes=lambda: counted)}) == {  # type: ignore[arg-type]
        "harbor": {"started": 12, "failed": 1, "retried": 2}
    }
    summary = {
        "gain": {},
        "problems": {},
        "sandboxes": sandbox_counts({"c": EnvDatasets(train=None, sandboxes=lambda: counted)}),
        "time": {"total_s": 1.0, "eval_share": 0.0},
    }  # type: ignore[arg-type]
    assert "sandboxes (harbor): 12 started, 1 failed, 2 retried" in summary_lines(summary)

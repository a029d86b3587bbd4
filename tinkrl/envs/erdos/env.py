"""Test-time RL for discovery: the Erdős minimum-overlap environment (TTT-Discover style).

One run attacks one open problem. Every group of rollouts starts from a construction in the
reuse buffer (buffer.py), sees its code, its C₅ and the tail of its output, and writes a
Python program that returns a better step function h. The program runs in a sandbox
(runner.py); tinkrl validates the returned h and computes C₅ itself (overlap.py);
reward = 1/C₅, 0 for invalid output with the reason in the step's logs. The group's best
valid children enter the buffer, which is saved in the run directory with `best.json` and a
plot of the best h (`best_h.png`), so a restarted run resumes its search.

Two-phase sampling (`teacher_forcing`): when the first response runs out of `max_tokens`,
a fixed closing text is appended as part of the next observation (so it is never trained
on) and the model writes its final code in what is left of `context_window_tokens`.

Metrics: each finished episode reports `erdos/valid` (and `erdos/c5` when valid) as step
metrics; `ErdosDataset.batch_metrics(step)` gives the per-step `erdos/best_c5`,
`erdos/batch_best_c5` and `erdos/valid_frac` (plus the share of each failure reason).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tinker

from tinkrl.envs.erdos import overlap as em
from tinkrl.envs.erdos.buffer import Entry, ReuseBuffer
from tinkrl.envs.erdos.config import ErdosEnvConfig
from tinkrl.envs.erdos.runner import NO_CODE, ProgramRunner, RunOutcome, extract_code, invalid
from tinkrl.errors import ConfigError
from tinkrl.rl.types import Action, Env, EnvDatasets, EnvGroupBuilder, Metrics, RLDataset, StepResult, StopCondition
from tinkrl.sandbox.base import SandboxProvider

if TYPE_CHECKING:
    from tinkrl.envs import EnvContext


RECORD_C5 = 0.380876  # TTT-Discover (2026); AlphaEvolve 0.380924, Haugland 0.380927
_MIN_PHASE2_TOKENS = 16


SYSTEM_PROMPT = (
    "You are an expert mathematician and Python programmer. You improve constructions "
    "for open problems by writing programs that search for them."
)


def build_messages(cfg: ErdosEnvConfig, parent: Entry) -> list[dict[str, str]]:
    """The conversation that asks for an improvement of `parent`."""
    n = cfg.n_points
    lines = [
        "Erdős' minimum overlap problem. Find a step function h on [0, 2] with values in [0, 1] "
        "and integral 1 that makes",
        "    C5(h) = max over shifts k of ∫ h(x) (1 - h(x + k)) dx",
        "as small as possible, where 1 - h is taken as 0 outside [0, 2]. Smaller is better: the best "
        f"known value is C5 ≈ {RECORD_C5} (earlier records 0.380924 and 0.380927).",
        "",
        f"h is given by n_points = {n} values: h[i] is its value on [2i/{n}, 2(i+1)/{n}). So 0 <= h[i] <= 1 "
        f"and sum(h) = {n / 2:g}; then C5 = max(np.correlate(h, 1 - h, mode='full')) * 2 / {n}.",
        "",
        f"Write one ```python block that defines run() returning the {n} values of h. numpy (as np) and "
        "scipy are available; `initial_h_values` (numpy array, the construction below) and `n_points` are "
        f"predefined. Start from initial_h_values and improve it, e.g. by local search or gradient steps. "
        f"The program must finish within {cfg.timeout_s:g} seconds. What it prints is shown next time. "
        "C5 is computed from the h you return; printed values are ignored. A skeleton:",
        "```python",
        "def run(seed=0):",
        "    rng = np.random.default_rng(seed)",
        "    h = initial_h_values.copy()",
        "    # ... change h to lower C5, keeping 0 <= h <= 1 and sum(h) == n_points / 2 ...",
        "    return h",
        "```",
        "",
        f"Current construction: C5 = {parent.c5:.6f}.",
    ]
    if parent.code:
        code = parent.code
        if len(code) > cfg.prompt_code_chars:
            code = code[: cfg.prompt_code_chars] + "\n# ... (truncated)"
        if parent.parent_c5 is not None:
            lines.append(f"This program improved C5 from {parent.parent_c5:.6f} to {parent.c5:.6f}:")
        else:
            lines.append("It was produced by this program:")
        lines += ["```python", code.rstrip(), "```"]
        tail = parent.stdout_tail[-cfg.stdout_tail_chars :] if cfg.stdout_tail_chars else ""
        if tail.strip():
            lines += ["Its output ended with:", "```", tail.rstrip(), "```"]
    else:
        lines.append("It is a random starting point.")
    lines += ["", "Return an h with a smaller C5."]
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]


@dataclass
class EpisodeResult:
    """One episode: step, group, parent entry, the program's outcome and code, and whether it was teacher-forced."""

    step: int
    group_key: str
    parent_id: str
    outcome: RunOutcome
    code: str | None
    forced: bool


class ErdosSearch:
    """What all envs of a run share: the buffer, the program runner, results and the best so far."""

    def __init__(self, cfg: ErdosEnvConfig, renderer: Any, runner: ProgramRunner, run_dir: Path, seed: int = 0):
        self.cfg = cfg
        self.renderer = renderer
        self.runner = runner
        self.run_dir = Path(run_dir)
        self.seed = seed
        self.buffer = ReuseBuffer(
            cfg.buffer_size,
            cfg.epsilon,
            sampler=cfg.sampler,
            puct_c=cfg.puct_c,
            children_per_parent=cfg.children_per_parent,
            path=self.run_dir / "erdos_buffer.json",
        )
        self.resumed = self.buffer.load()
        if self.buffer.entries and len(self.buffer.best().h) != cfg.n_points:
            raise ConfigError(
                f"{self.buffer.path} holds constructions of {len(self.buffer.best().h)} points, "
                f"but env.n_points={cfg.n_points}; use a new run directory"
            )
        if not self.resumed:
            rng = np.random.default_rng([seed, 0x5EED])
            for _ in range(cfg.initial_states):
                h = em.random_construction(cfg.n_points, rng)
                self.buffer.add_initial(h, em.c5(h))
        self.pending: list[EpisodeResult] = []
        self.step_results: dict[int, list[EpisodeResult]] = defaultdict(list)
        self._parallel_runs = cfg.parallel_runs or os.cpu_count() or 1
        self._semaphore: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self.best_c5 = self._recorded_best()
        self._write_best_if_improved()

    # -- running programs ---------------------------------------------------------------
    async def run_program(self, code: str, initial_h: list[float], seed: int) -> RunOutcome:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._semaphore[0] is not loop:  # one per event loop
            self._semaphore = (loop, asyncio.Semaphore(self._parallel_runs))
        async with self._semaphore[1]:
            return await asyncio.to_thread(self.runner.run, code, np.asarray(initial_h), seed)

    def record(self, result: EpisodeResult) -> None:
        self.pending.append(result)
        self.step_results[result.step].append(result)

    # -- buffer updates -----------------------------------------------------------------
    def flush(self, group_key: str | None = None) -> None:
        """Move finished episodes (of one group, or all) into the buffer; persist the best."""
        take = [r for r in self.pending if group_key is None or r.group_key == group_key]
        if not take:
            return
        taken = {id(r) for r in take}
        self.pending = [r for r in self.pending if id(r) not in taken]
        by_group: dict[tuple[str, str, int], list[EpisodeResult]] = defaultdict(list)
        for r in take:
            by_group[(r.group_key, r.parent_id, r.step)].append(r)
        for (_, parent_id, step), results in by_group.items():
            children = [
                (r.outcome.h, r.outcome.c5, r.code or "", r.outcome.stdout_tail) for r in results if r.outcome.valid
            ]
            self.buffer.add_children(parent_id, children, step)
        self._write_best_if_improved()

    def _recorded_best(self) -> float:
        path = self.run_dir / "best.json"
        if path.exists():
            try:
                return float(json.loads(path.read_text())["c5"])
            except (ValueError, KeyError):
                pass
        return math.inf

    def _write_best_if_improved(self) -> None:
        best = self.buffer.best()
        if not best.c5 < self.best_c5:
            return
        self.best_c5 = best.c5
        h = np.asarray(best.h)
        exact = em.c5_exact(h) if len(h) <= 1200 else None
        payload = {
            "c5": best.c5,
            # The exact value of C₅ for these float values, rounded up at 20 decimals.
            "c5_exact_upper": None if exact is None else _decimal_upper(exact, 20),
            "n_points": len(h),
            "integral": float(h.sum()) * 2 / len(h),
            "step": best.step,
            "id": best.id,
            "parent_id": best.parent_id,
            "code": best.code,
            "stdout_tail": best.stdout_tail,
            "h": best.h,
        }
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / "best.json.tmp"
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, self.run_dir / "best.json")
        if self.cfg.plot:
            plot_construction(h, best.c5, best.step, self.run_dir / "best_h.png")

    # -- metrics ------------------------------------------------------------------------
    def batch_metrics(self, step: int) -> Metrics:
        self.flush()
        for old in [s for s in self.step_results if s < step - 2]:  # reported long ago
            del self.step_results[old]
        results = self.step_results.get(step, [])
        metrics: Metrics = {"erdos/best_c5": self.buffer.best().c5, "erdos/buffer_size": float(len(self.buffer))}
        if not results:
            return metrics
        valid = [r.outcome.c5 for r in results if r.outcome.valid]
        metrics["erdos/valid_frac"] = len(valid) / len(results)
        metrics["erdos/episodes"] = float(len(results))
        metrics["erdos/forced_frac"] = sum(r.forced for r in results) / len(results)
        if valid:
            metrics["erdos/batch_best_c5"] = min(valid)
        for reason, count in Counter(r.outcome.reason for r in results if not r.outcome.valid).items():
            metrics[f"erdos/invalid/{reason}"] = count / len(results)
        return metrics


def _decimal_upper(value: Fraction, digits: int) -> str:
    """`value` rounded up to `digits` decimals, as a decimal string (an exact upper bound)."""
    q = -((-value.numerator * 10**digits) // value.denominator)
    return f"{q // 10**digits}.{q % 10**digits:0{digits}d}"


def plot_construction(h: np.ndarray, c5_value: float, step: int, path: Path) -> None:
    """Plot the step function `h` to the PNG at `path` (replaced atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.stairs(h, np.linspace(0.0, 2.0, len(h) + 1), fill=True, alpha=0.35)
    ax.stairs(h, np.linspace(0.0, 2.0, len(h) + 1))
    ax.set_xlim(0, 2)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("x")
    ax.set_ylabel("h(x)")
    found = "initial" if step < 0 else f"step {step}"
    ax.set_title(f"best h: C5 = {c5_value:.7f} ({found}, n = {len(h)})")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


class ErdosEnv(Env):
    """One attempt to improve one buffer entry."""

    def __init__(self, search: ErdosSearch, parent: Entry, step: int, group_key: str, seed: int):
        self.search = search
        self.cfg = search.cfg
        self.parent = parent
        self.step_index = step
        self.group_key = group_key
        self.seed = seed
        self._ob_len = 0
        self._response: list[int] = []
        self._phase = 1
        self._forced = False
        self._stop: StopCondition = []
        self._ob: tinker.ModelInput | None = None

    @property
    def _tokenizer(self):
        return self.search.renderer.tokenizer

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        ob = self.search.renderer.build_generation_prompt(build_messages(self.cfg, self.parent))
        self._ob, self._ob_len = ob, ob.length
        self._stop = self.search.renderer.stop_sequences()
        return ob, self._stop

    def _forced_tokens(self) -> list[int]:
        return list(self._tokenizer.encode(self.cfg.closing_text, add_special_tokens=False))

    def max_tokens(self, default: int) -> int:
        room = self.cfg.context_window_tokens - self._ob_len
        if self._phase == 1:
            if self.cfg.teacher_forcing:  # keep room for the closing text and a final answer
                room -= len(self._forced_tokens()) + _MIN_PHASE2_TOKENS
            return max(1, min(self.cfg.max_tokens or default, room))
        return max(1, room)

    async def step(self, action: Action, *, stop_reason: str = "stop") -> StepResult:
        self._response += list(action)
        if self._phase == 1 and stop_reason == "length" and self.cfg.teacher_forcing:
            forced = self._forced_tokens()
            assert self._ob is not None
            tokens = self._ob.to_ints() + list(action) + forced
            if self.cfg.context_window_tokens - len(tokens) >= _MIN_PHASE2_TOKENS:
                self._phase, self._forced = 2, True
                self._response += forced
                next_ob = tinker.ModelInput.from_ints(tokens)
                self._ob, self._ob_len = next_ob, len(tokens)
                return StepResult(
                    reward=0.0, episode_done=False, next_observation=next_ob, next_stop_condition=self._stop, metrics={}
                )
        return await self._finish()

    async def _finish(self) -> StepResult:
        text = self._tokenizer.decode(self._response, skip_special_tokens=True)
        code = extract_code(text)
        if code is None:
            outcome = invalid(NO_CODE, "no ```python block in the response")
        else:
            outcome = await self.search.run_program(code, self.parent.h, self.seed)
        self.search.record(EpisodeResult(self.step_index, self.group_key, self.parent.id, outcome, code, self._forced))
        metrics: Metrics = {"erdos/valid": float(outcome.valid), "erdos/forced": float(self._forced)}
        if outcome.valid:
            metrics["erdos/c5"] = float(outcome.c5)  # type: ignore[arg-type]
            metrics["erdos/improved"] = float(outcome.c5 < self.parent.c5)  # type: ignore[operator]
        logs = {
            "erdos/result": "valid" if outcome.valid else f"invalid: {outcome.reason}",
            "erdos/detail": outcome.detail[-500:],
            "erdos/parent": self.parent.id,
        }
        if outcome.valid:
            logs["erdos/c5"] = f"{outcome.c5:.8f}"
        return StepResult(
            reward=outcome.reward,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self._stop,
            metrics=metrics,
            logs=logs,
        )


class ErdosGroupBuilder(EnvGroupBuilder):
    """group_size attempts on one buffer entry; their results enter the buffer as the group ends."""

    def __init__(self, search: ErdosSearch, parent: Entry, step: int, index: int, group_size: int):
        self.search, self.parent, self.step, self.index = search, parent, step, index
        self.group_size = group_size
        self.key = f"{step}/{index}"

    async def make_envs(self) -> Sequence[Env]:
        base = self.search.seed * 1_000_003 + self.step * 10_007 + self.index * 101
        return [
            ErdosEnv(self.search, self.parent, self.step, self.key, seed=(base + i) % 2**31)
            for i in range(self.group_size)
        ]

    async def compute_group_rewards(self, trajectories_G, envs_G) -> list[tuple[float, Metrics]]:
        self.search.flush(self.key)
        return [(0.0, {}) for _ in trajectories_G]

    def logging_tags(self) -> list[str]:
        return ["erdos"]


class ErdosDataset(RLDataset):
    """Batches of `groups_per_batch` groups, each starting from an entry the buffer picks."""

    def __init__(self, search: ErdosSearch, group_size: int, groups_per_batch: int):
        self.search = search
        self.group_size = group_size
        self.groups_per_batch = groups_per_batch

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        self.search.flush()  # results of earlier steps the trainer did not hand back per group
        rng = np.random.default_rng([self.search.seed, index, 0xB0F])
        parents = self.search.buffer.select(self.groups_per_batch, rng)
        return [ErdosGroupBuilder(self.search, p, index, i, self.group_size) for i, p in enumerate(parents)]

    def __len__(self) -> int:
        return 10**9  # an open-ended search: the trainer's max_steps decides when it stops

    def batch_metrics(self, index: int) -> Metrics:
        """Per-step search metrics; call after the batch's rollouts finished."""
        return self.search.batch_metrics(index)


def build_erdos_dataset(
    cfg: ErdosEnvConfig,
    *,
    renderer: Any,
    group_size: int,
    groups_per_batch: int,
    run_dir: Path,
    seed: int,
    sandbox_provider: SandboxProvider,
) -> ErdosDataset:
    """The trainer's entry point: a resumable discovery run stored under run_dir."""
    runner = ProgramRunner(
        sandbox_provider,
        cfg.n_points,
        timeout_s=cfg.timeout_s,
        memory_mb=cfg.memory_mb,
        integral_tol=cfg.integral_tol,
        stdout_tail_chars=cfg.stdout_tail_chars,
    )
    search = ErdosSearch(cfg, renderer, runner, Path(run_dir), seed=seed)
    return ErdosDataset(search, group_size, groups_per_batch)


def build_datasets(cfg: ErdosEnvConfig, ctx: EnvContext) -> EnvDatasets:
    """The registry's entry point: the search's dataset, and its per-step metrics as a hook."""
    dataset = build_erdos_dataset(
        cfg,
        renderer=ctx.renderer,
        group_size=ctx.group_size,
        groups_per_batch=ctx.groups_per_batch,
        run_dir=Path(ctx.run_dir),
        seed=ctx.seed,
        sandbox_provider=ctx.sandbox.get(),
    )
    return EnvDatasets(train=dataset, on_step=lambda step, groups: dataset.batch_metrics(step))

"""Single-turn math environments: synthetic arithmetic and the GSM8K / MATH / Polaris datasets.

`environments: {arithmetic: {}}` (or gsm8k, math500, hendrycks, polaris; all are `type: math`
with `env.dataset` fixed). Each episode asks one question as a user turn and grades the single
reply:

- reward = correct + format_coef * (format - 1), i.e. 1 / 0, minus `format_coef` when the reply
  is badly formed; metrics `correct` and `format` (and `grade_timeout` when the grader timed out).
- arithmetic: "What is 47 + 38?" (no instruction unless `instruction` is set); the answer is the
  LAST number in the reply; format = the reply ended with the stop token and contains a number.
- datasets: the question plus `instruction` (default: asks for the answer in \\boxed{}); the
  answer is the last \\boxed{} content, else what follows `####`, else the last number
  (`tinkrl.grading.extract_final_answer`), graded by `tinkrl.grading.grade_async` (exact/numeric
  fast path, then math-verify in a worker process with a timeout); format = ended with the stop
  token and contains \\boxed{}. Text before a closing `</think>` is ignored. `grade_reply` is this
  grading on its own (for servers exposing the same problems).

Arithmetic problems are drawn from a seeded RNG per (seed, batch index), so a resumed run gets
the same batches. Each (a, op, b) is assigned to train or test by a hash of the problem itself
(`test_fraction` of the problem space is held out), so train and eval never share a problem.

Datasets are read with HF `datasets` from `data_path` (a local file or directory) or from the
local HF cache, never downloaded; a missing dataset is one clear error naming where it looked.
In a directory, files are assigned to splits by name (a path part or file name containing
`train` / `test`; an HF snapshot such as gsm8k's `main/train-00000-of-00001.parquet` works as
is); `tinkrl/envs/data/<dataset>/` holds small samples in that layout.
- gsm8k: train = train split, test = the first `eval_problems` of the test split.
- hendrycks: train = every problem of all 7 subjects (train + test) minus the MATH-500 problems,
  test = MATH-500 (read from `test_data_path` or the HF cache); answers = last \\boxed{} of the
  solution.
- math500, polaris, and any source without a test split: the first `eval_problems` of a fixed
  shuffle are held out as test (at most half the pool), the rest is train.

Test set: `EnvDatasets.test` is one batch (`get_batch(0)`, `len == 1`) holding `ctx.eval_problems`
problems (fixed for a given dataset, independent of the run seed), one builder per problem with
GROUP SIZE 1 (one env each, for greedy eval). For several samples per problem set
`test.group_size = k` (or a builder's `num_envs`) before calling `get_batch`/`make_envs`.

Train set: `get_batch(i)` returns `ctx.groups_per_batch` builders of `ctx.group_size` copies of
one problem each (logging tag `ctx.key`), deterministic in (seed, i). Dataset problems run in
epochs, reshuffled per epoch when `splits.train.shuffle` (default) and capped by
`splits.train.num_samples`; `len` = batches per epoch (arithmetic: effectively unbounded).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import tinker
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tinkrl import grading
from tinkrl.errors import ConfigError
from tinkrl.rl.types import Action, Env, EnvGroupBuilder, Metrics, RLDataset, StepResult, StopCondition

if TYPE_CHECKING:
    from tinkrl.envs import EnvContext, EnvDatasets

DatasetName = Literal["arithmetic", "gsm8k", "math500", "hendrycks", "polaris"]
ARITHMETIC_LEN = 10**9  # "unbounded": the trainer stops at max_steps
BOXED_INSTRUCTION = " Write your final answer in \\boxed{} format."
GSM8K_INSTRUCTION = " Provide a numerical answer without units, written inside \\boxed{}."
_TEST_SHUFFLE_SEED = 0x7E57  # fixed: the eval set does not change with the run seed


class MathEnvConfig(BaseModel):
    """`env=arithmetic env.max_value=999 ...`: single-turn math problems graded on the final answer."""

    model_config = ConfigDict(extra="forbid")

    dataset: DatasetName = "arithmetic"
    # -- arithmetic --------------------------------------------------------------------------------
    min_value: int = 10
    """Smallest operand (arithmetic)."""
    max_value: int = 99
    """Largest operand (arithmetic)."""
    operations: list[Literal["+", "-", "*", "/"]] = Field(default_factory=lambda: ["+"], min_length=1)
    """Operators to draw from; "/" problems always divide exactly (a = b * q, operands b, q in range)."""
    test_fraction: float = Field(0.1, gt=0, lt=1)
    """Share of the arithmetic problem space held out for eval (by a hash of the problem)."""
    # -- datasets ----------------------------------------------------------------------------------
    data_path: str | None = None
    """Local copy of the dataset (file or directory); None = the local HF cache."""
    test_data_path: str | None = None
    """hendrycks only: local copy of MATH-500 (the test set, excluded from training)."""
    # -- prompting and reward ----------------------------------------------------------------------
    instruction: str | None = None
    """Appended as is to each question (start it with a space); None = nothing for arithmetic, a \\boxed{}
    request otherwise."""
    system_prompt: str | None = None
    """Optional system turn before the question (None = the renderer's default)."""
    format_coef: float = Field(0.0, ge=0)
    """Penalty for a badly formed reply: reward = correct + format_coef * (format - 1)."""
    grade_timeout_s: float = Field(10.0, gt=0)
    """Per-answer time limit for math-verify; a timed-out grade is incorrect."""

    @field_validator("max_value")
    @classmethod
    def _max_at_least_min(cls, v: int, info: ValidationInfo) -> int:
        if "min_value" in info.data and v < info.data["min_value"]:
            raise ValueError(f"must be >= min_value ({info.data['min_value']})")
        return v

    @field_validator("operations")
    @classmethod
    def _division_needs_nonzero(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if "/" in v and info.data.get("min_value") == info.data.get("max_value") == 0:
            raise ValueError("'/' needs a non-zero operand in [min_value, max_value]")
        return v

    @field_validator("data_path", "test_data_path")
    @classmethod
    def _only_for_datasets(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("dataset") == "arithmetic":
            raise ValueError("does not apply to the synthetic arithmetic dataset")
        return v

    def build(self, ctx: EnvContext) -> EnvDatasets:
        from tinkrl.envs import EnvDatasets

        instruction = self.instruction
        if instruction is None and self.dataset != "arithmetic":
            instruction = GSM8K_INSTRUCTION if self.dataset == "gsm8k" else BOXED_INSTRUCTION
        spec = EpisodeSpec(
            renderer=ctx.renderer,
            instruction=instruction or "",
            system_prompt=self.system_prompt,
            style="number" if self.dataset == "arithmetic" else "boxed",
            format_coef=self.format_coef,
            grade_timeout_s=self.grade_timeout_s,
            tag=ctx.key,
        )
        if self.dataset == "arithmetic":
            gen = ArithmeticProblems(self.min_value, self.max_value, list(self.operations), self.test_fraction)
            gen.sample(_rng("probe"), test=False)  # an empty train split fails now, not at step 0
            train: RLDataset = ArithmeticDataset(gen, spec, ctx.group_size, ctx.groups_per_batch, ctx.seed)
            test_problems = gen.test_problems(ctx.eval_problems)
        else:
            try:
                train_problems, test_problems = load_problems(self, ctx.eval_problems)
            except ConfigError as e:
                raise ConfigError(f"environments.{ctx.key}.env: {e}") from None
            split = ctx.entry.splits.get("train") if ctx.entry is not None else None
            if split is not None and split.num_samples is not None:
                train_problems = train_problems[: split.num_samples]
            if not train_problems:
                raise ConfigError(f"environments.{ctx.key}: the {self.dataset} train split is empty")
            train = ProblemListDataset(
                train_problems,
                spec,
                ctx.group_size,
                ctx.groups_per_batch,
                ctx.seed,
                shuffle=split.shuffle if split is not None else True,
            )
        test = TestDataset(test_problems, spec) if test_problems else None
        return EnvDatasets(train=train, test=test)


# ------------------------------------------------------------------------------------------------
# Problems and episodes
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str  # the reference answer (a number for arithmetic, LaTeX/text for datasets)
    id: str = ""


@dataclass(frozen=True)
class EpisodeSpec:
    """How every episode of one environment is prompted and graded."""

    renderer: Any
    instruction: str
    system_prompt: str | None
    style: Literal["number", "boxed"]
    format_coef: float
    grade_timeout_s: float
    tag: str


class MathEnv(Env):
    """One question, one reply, graded on its final answer."""

    def __init__(self, problem: Problem, spec: EpisodeSpec):
        self.problem = problem
        self.spec = spec

    def messages(self) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.spec.system_prompt}] if self.spec.system_prompt else []
        return msgs + [{"role": "user", "content": self.problem.question + self.spec.instruction}]

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        return self.spec.renderer.build_generation_prompt(self.messages()), self.spec.renderer.stop_sequences()

    async def step(self, action: Action, *, stop_reason: str = "stop") -> StepResult:
        parsed = self.spec.renderer.parse_response(list(action))
        reply = await grade_reply(
            parsed.message.get("content") or "", self.problem.answer, self.spec.style, self.spec.grade_timeout_s
        )
        fmt = bool(parsed.ended_cleanly and reply.well_formed)
        reward = float(reply.correct) + self.spec.format_coef * (float(fmt) - 1.0)
        metrics: Metrics = {"correct": float(reply.correct), "format": float(fmt)}
        if reply.timed_out:
            metrics["grade_timeout"] = 1.0
        logs = {"answer": (reply.given or "")[:200], "reference": self.problem.answer[:200], "grade": reply.method}
        if self.problem.id:
            logs["problem_id"] = self.problem.id
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self.spec.renderer.stop_sequences(),
            metrics=metrics,
            logs=logs,
        )


@dataclass(frozen=True)
class ReplyGrade:
    correct: bool
    well_formed: bool  # number style: has a number; boxed style: has \boxed{}
    given: str | None  # the extracted final answer
    method: str  # "number" or grading.Grade.method
    timed_out: bool = False


async def grade_reply(
    text: str, reference: str, style: Literal["number", "boxed"], timeout_s: float = 10.0
) -> ReplyGrade:
    """Grade a reply's text the way MathEnv does (also used by servers that expose these problems)."""
    body = grading.strip_think(text)
    if style == "number":
        given = grading.extract_last_number(body)
        correct = given is not None and grading.to_number(given) == grading.to_number(reference)
        return ReplyGrade(correct, given is not None, given, "number")
    given = grading.extract_final_answer(text)
    g = await grading.grade_async(given, reference, grading.pool_for(timeout_s))
    return ReplyGrade(g.correct, grading.extract_boxed(body) is not None, given, g.method, g.timed_out)


class MathGroupBuilder(EnvGroupBuilder):
    """`num_envs` copies of one problem (a GRPO group)."""

    def __init__(self, problem: Problem, spec: EpisodeSpec, num_envs: int):
        self.problem = problem
        self.spec = spec
        self.num_envs = num_envs

    async def make_envs(self) -> Sequence[Env]:
        return [MathEnv(self.problem, self.spec) for _ in range(self.num_envs)]

    def logging_tags(self) -> list[str]:
        return [self.spec.tag]


# ------------------------------------------------------------------------------------------------
# Arithmetic
# ------------------------------------------------------------------------------------------------


def _rng(*parts: int | str) -> random.Random:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


class ArithmeticProblems:
    """Synthetic `a op b` problems; each problem's split is a hash of the problem itself."""

    def __init__(self, min_value: int, max_value: int, operations: list[str], test_fraction: float = 0.1):
        self.lo, self.hi, self.ops, self.test_fraction = min_value, max_value, operations, test_fraction

    def is_test(self, a: int, op: str, b: int) -> bool:
        h = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "little") / 2**64 < self.test_fraction

    def _draw(self, rng: random.Random) -> tuple[int, str, int, int]:
        op = rng.choice(self.ops)
        if op == "/":
            b = 0
            while b == 0:
                b = rng.randint(self.lo, self.hi)
            q = rng.randint(self.lo, self.hi)
            return b * q, op, b, q
        a, b = rng.randint(self.lo, self.hi), rng.randint(self.lo, self.hi)
        return a, op, b, (a + b if op == "+" else a - b if op == "-" else a * b)

    @staticmethod
    def problem(a: int, op: str, b: int, answer: int) -> Problem:
        sym = {"*": "*", "/": "/"}.get(op, op)
        return Problem(f"What is {a} {sym} {b}?", str(answer), id=f"{a}{op}{b}")

    def sample(self, rng: random.Random, test: bool) -> Problem:
        for _ in range(100_000):
            a, op, b, ans = self._draw(rng)
            if self.is_test(a, op, b) == test:
                return self.problem(a, op, b, ans)
        raise ConfigError(
            f"arithmetic: no {'test' if test else 'train'} problems in [{self.lo}, {self.hi}] "
            f"with operations {self.ops}; widen the range or change test_fraction"
        )

    def test_problems(self, n: int) -> list[Problem]:
        """n distinct held-out problems (fewer if the space has fewer); fixed for a given config."""
        rng = _rng("arithmetic-test", _TEST_SHUFFLE_SEED)
        seen: dict[str, Problem] = {}
        tries = 0
        while len(seen) < n and tries < 200 * max(n, 1):
            tries += 1
            a, op, b, ans = self._draw(rng)
            if self.is_test(a, op, b):
                p = self.problem(a, op, b, ans)
                seen.setdefault(p.id, p)
        return list(seen.values())


class ArithmeticDataset(RLDataset):
    def __init__(self, gen: ArithmeticProblems, spec: EpisodeSpec, group_size: int, groups_per_batch: int, seed: int):
        self.gen, self.spec = gen, spec
        self.group_size, self.groups_per_batch, self.seed = group_size, groups_per_batch, seed

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        rng = _rng("arithmetic-train", self.seed, index)
        return [
            MathGroupBuilder(self.gen.sample(rng, test=False), self.spec, self.group_size)
            for _ in range(self.groups_per_batch)
        ]

    def __len__(self) -> int:
        return ARITHMETIC_LEN


class ProblemListDataset(RLDataset):
    """Batches over a fixed problem list, in epochs (reshuffled per epoch when `shuffle`)."""

    def __init__(
        self,
        problems: list[Problem],
        spec: EpisodeSpec,
        group_size: int,
        groups_per_batch: int,
        seed: int,
        shuffle: bool = True,
    ):
        self.problems, self.spec = problems, spec
        self.group_size, self.groups_per_batch, self.seed, self.shuffle = group_size, groups_per_batch, seed, shuffle
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.problems)))
            if self.shuffle:
                _rng("problems", self.seed, epoch).shuffle(order)
            self._orders = {epoch: order}  # keep only the current epoch's order
        return self._orders[epoch]

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        n = len(self.problems)
        out = []
        for j in range(self.groups_per_batch):
            k = index * self.groups_per_batch + j
            epoch, pos = divmod(k, n)
            out.append(MathGroupBuilder(self.problems[self._order(epoch)[pos]], self.spec, self.group_size))
        return out

    def __len__(self) -> int:
        return max(1, len(self.problems) // self.groups_per_batch)


class TestDataset(RLDataset):
    """All held-out problems in batch 0, `group_size` envs per problem (default 1: greedy eval)."""

    def __init__(self, problems: list[Problem], spec: EpisodeSpec, group_size: int = 1):
        self.problems, self.spec, self.group_size = problems, spec, group_size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if index != 0:
            raise IndexError(f"the test set is one batch (index 0), got {index}")
        return [MathGroupBuilder(p, self.spec, self.group_size) for p in self.problems]

    def __len__(self) -> int:
        return 1


# ------------------------------------------------------------------------------------------------
# HF datasets (local only)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HFSource:
    hf_id: str
    configs: tuple[str | None, ...]
    splits: tuple[str, ...]


SOURCES: dict[str, HFSource] = {
    "gsm8k": HFSource("openai/gsm8k", ("main",), ("train", "test")),
    "math500": HFSource("HuggingFaceH4/MATH-500", (None,), ("test",)),
    "hendrycks": HFSource(
        "EleutherAI/hendrycks_math",
        (
            "algebra",
            "counting_and_probability",
            "geometry",
            "intermediate_algebra",
            "number_theory",
            "prealgebra",
            "precalculus",
        ),
        ("train", "test"),
    ),
    "polaris": HFSource("POLARIS-Project/Polaris-Dataset-53K", (None,), ("train",)),
}
_DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
SAMPLE_DIR = Path(__file__).parent / "data"


@contextmanager
def _hf_offline():
    """Make HF datasets/hub read only what is cached locally, for the duration of a load."""
    import datasets
    import huggingface_hub.constants as hub_constants

    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE, os.environ.get("HF_DATASETS_OFFLINE"))
    bars_were_off = not datasets.is_progress_bar_enabled()
    datasets.config.HF_HUB_OFFLINE = True
    hub_constants.HF_HUB_OFFLINE = True
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not bars_were_off:
            datasets.enable_progress_bars()
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("HF_DATASETS_OFFLINE", None)
        else:
            os.environ["HF_DATASETS_OFFLINE"] = saved[2]


def _split_of(path: Path, root: Path) -> str | None:
    for part in reversed(path.relative_to(root).parts):
        low = part.lower()
        for split in ("train", "test", "validation"):
            if (
                low == split
                or low.startswith(split + ".")
                or low.startswith(split + "-")
                or low.startswith(split + "_")
                or re.search(rf"[-_.]{split}[-_.]", low)
            ):
                return split
    return None


def _load_files(files: list[Path]) -> list[dict]:
    import datasets

    by_fmt: dict[str, list[str]] = {}
    for f in files:
        by_fmt.setdefault(_DATA_SUFFIXES[f.suffix.lower()], []).append(str(f))
    rows: list[dict] = []
    for fmt, paths in by_fmt.items():
        with _hf_offline():
            ds = datasets.load_dataset(fmt, data_files=sorted(paths), split="train")
        rows.extend(ds.to_list())
    return rows


def read_local(path: str | Path, config: str | None = None) -> dict[str | None, list[dict]]:
    """Rows of a local dataset copy by split (None = no split in the names). Raises ConfigError."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"data_path {str(p)!r} does not exist")
    if p.is_file():
        if p.suffix.lower() not in _DATA_SUFFIXES:
            raise ConfigError(f"data_path {str(p)!r}: unsupported file type (use {', '.join(_DATA_SUFFIXES)})")
        return {None: _load_files([p])}
    if (p / "dataset_dict.json").exists() or (p / "state.json").exists():  # datasets' save_to_disk
        import datasets

        obj = datasets.load_from_disk(str(p))
        if isinstance(obj, datasets.DatasetDict):
            return {name: d.to_list() for name, d in obj.items()}
        return {None: obj.to_list()}
    files = sorted(
        f
        for f in p.rglob("*")
        if f.is_file()
        and f.suffix.lower() in _DATA_SUFFIXES
        and not f.name.startswith(".")
        and f.name not in ("dataset_info.json", "dataset_dict.json")
    )
    if config:  # HF repo layout with one folder per config (gsm8k: main/, socratic/)
        in_config = [f for f in files if config in f.relative_to(p).parts[:-1]]
        files = in_config or files
    if not files:
        raise ConfigError(f"data_path {str(p)!r} holds no data files ({', '.join(_DATA_SUFFIXES)})")
    groups: dict[str | None, list[Path]] = {}
    for f in files:
        groups.setdefault(_split_of(f, p), []).append(f)
    return {split: _load_files(fs) for split, fs in groups.items()}


def read_hf_cache(name: str) -> dict[str | None, list[dict]]:
    """Rows from the local HF cache by split; ConfigError naming where it looked when absent."""
    import datasets

    src = SOURCES[name]
    out: dict[str | None, list[dict]] = {}
    try:
        with _hf_offline():
            for config in src.configs:
                for split in src.splits:
                    ds = datasets.load_dataset(src.hf_id, config, split=split)
                    out.setdefault(split, []).extend(ds.to_list())
    except Exception as e:  # noqa: BLE001  (datasets raises many types when a dataset is absent offline)
        import huggingface_hub.constants as hub_constants

        raise ConfigError(
            f"{name}: dataset {src.hf_id} is not available locally (looked in the HF caches "
            f"{hub_constants.HF_HUB_CACHE} and {datasets.config.HF_DATASETS_CACHE}; tinkrl never downloads "
            f"datasets): download it once (`hf download --repo-type dataset {src.hf_id}`) or set env.data_path "
            f"to a local copy [{type(e).__name__}]"
        ) from None
    return out


def _read(name: str, data_path: str | None) -> dict[str | None, list[dict]]:
    if data_path:
        configs = SOURCES[name].configs  # one named config (gsm8k: main/): prefer its folder
        return read_local(data_path, configs[0] if len(configs) == 1 else None)
    return read_hf_cache(name)


def _require(rows: list[dict], columns: tuple[str, ...], where: str) -> None:
    if rows and any(c not in rows[0] for c in columns):
        raise ConfigError(f"{where}: rows need columns {list(columns)}, found {sorted(rows[0])}")


def _norm_problem(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def rows_to_problems(name: str, rows: list[dict], where: str, split: str = "") -> list[Problem]:
    """Dataset rows -> problems with reference answers (rows without an answer are skipped)."""
    out = []
    tag = f"{name}/{split}/" if split else f"{name}/"
    if name == "gsm8k":
        _require(rows, ("question", "answer"), where)
        for i, r in enumerate(rows):
            ans = grading.extract_gsm8k_answer(str(r["answer"]))
            if ans:
                out.append(Problem(str(r["question"]), ans, id=f"{tag}{i}"))
    elif name == "hendrycks":
        _require(rows, ("problem", "solution"), where)
        for i, r in enumerate(rows):
            ans = grading.extract_boxed(str(r["solution"]))
            if ans:
                out.append(Problem(str(r["problem"]), ans, id=str(r.get("unique_id") or f"{tag}{i}")))
    else:  # math500, polaris: an answer column (MATH-500 also has the solution)
        _require(rows, ("problem", "answer"), where)
        for i, r in enumerate(rows):
            ans = str(r["answer"]).strip() if r["answer"] is not None else ""
            if not ans and r.get("solution"):
                ans = grading.extract_boxed(str(r["solution"])) or ""
            if ans:
                out.append(Problem(str(r["problem"]), ans, id=str(r.get("unique_id") or f"{tag}{i}")))
    return out


def _hold_out(pool: list[Problem], n: int) -> tuple[list[Problem], list[Problem]]:
    order = list(range(len(pool)))
    _rng("holdout", _TEST_SHUFFLE_SEED).shuffle(order)
    k = min(n, len(pool) // 2)
    return [pool[i] for i in order[k:]], [pool[i] for i in order[:k]]


def load_problems(cfg: MathEnvConfig, eval_problems: int) -> tuple[list[Problem], list[Problem]]:
    """(train, test) problems of a dataset preset, from local files or the HF cache."""
    name = cfg.dataset
    where = cfg.data_path or SOURCES[name].hf_id
    splits = _read(name, cfg.data_path)
    if name == "hendrycks":
        pool = rows_to_problems(name, [r for rows in splits.values() for r in rows], where)
        m500_splits = _read("math500", cfg.test_data_path)
        m500 = rows_to_problems(
            "math500",
            [r for rows in m500_splits.values() for r in rows],
            cfg.test_data_path or SOURCES["math500"].hf_id,
        )
        excluded = {_norm_problem(p.question) for p in m500}
        train = [p for p in pool if _norm_problem(p.question) not in excluded]
        return train, m500[:eval_problems]
    if name == "gsm8k" and "train" in splits and "test" in splits:
        return (
            rows_to_problems(name, splits["train"], where, "train"),
            rows_to_problems(name, splits["test"], where, "test")[:eval_problems],
        )
    pool = rows_to_problems(name, [r for rows in splits.values() for r in rows], where)
    return _hold_out(pool, eval_problems)

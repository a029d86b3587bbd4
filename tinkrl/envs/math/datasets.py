"""Reading the math datasets (GSM8K, MATH-500, Hendrycks MATH, Polaris) into problems, offline.

Datasets are read with HF `datasets` from `data_path` (a local file or directory) or from the
local HF cache, never downloaded; a missing dataset is one clear error naming where it looked.
In a directory, files are assigned to splits by name (a path part or file name containing
`train` / `test`; an HF snapshot such as gsm8k's `main/train-00000-of-00001.parquet` works as
is); `tinkrl/envs/math/data/<dataset>/` holds small samples in that layout.
- gsm8k: train = train split, test = the first `eval_problems` of the test split.
- hendrycks: train = every problem of all 7 subjects (train + test) minus the MATH-500 problems,
  test = MATH-500 (read from `test_data_path` or the HF cache); answers = last \\boxed{} of the
  solution.
- math500, polaris, and any source without a test split: the first `eval_problems` of a fixed
  shuffle are held out as test (at most half the pool), the rest is train.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tinkrl.envs.math import grading
from tinkrl.envs.math.problems import TEST_SHUFFLE_SEED, Problem, seeded_rng
from tinkrl.errors import ConfigError

if TYPE_CHECKING:
    from tinkrl.envs.math.config import MathEnvConfig


@dataclass(frozen=True)
class HFSource:
    """An HF dataset: its hub id, the configs to read (their rows pooled) and its splits."""

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
    seeded_rng("holdout", TEST_SHUFFLE_SEED).shuffle(order)
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

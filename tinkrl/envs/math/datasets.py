"""Reading the math datasets (GSM8K, MATH-500, Hendrycks MATH, Polaris) into problems.

Where the rows come from, in order:
1. `data_path` (a local file or directory), when set: read as is, never anything else;
2. the local HF caches (`datasets`' and the hub's), read offline;
3. else the Hugging Face hub: `datasets.load_dataset(ID, CONFIG)` with its normal online
   behaviour (it honours `HF_ENDPOINT`, `HF_HOME`, `HF_TOKEN`), cached, so later runs read step 2.
When 2 misses and 3 cannot happen (`HF_HUB_OFFLINE=1`, no connection, no such dataset), the error
is one line: the dataset id and configs, where it looked, and how to supply it.

A local copy (`data_path`) is a data file (.parquet, .jsonl, .json, .csv, .arrow), a
`save_to_disk` directory, or a directory of data files assigned to splits by name (a path part or
file name containing `train` / `test`): an HF snapshot such as gsm8k's
`main/train-00000-of-00001.parquet` (`hf download --repo-type dataset openai/gsm8k --local-dir DIR`)
works as is; `tinkrl/envs/math/data/<dataset>/` holds small samples in that layout.
- gsm8k: train = train split, test = the first `eval_problems` of the test split.
- hendrycks: train = every problem of all 7 subjects (train + test) minus the MATH-500 problems,
  test = MATH-500 (read from `test_data_path`, the HF cache or the hub); answers = last \\boxed{}
  of the solution.
- math500, polaris, and any source without a test split: the first `eval_problems` of a fixed
  shuffle are held out as test (at most half the pool), the rest is train.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tinkrl.envs.math import grading
from tinkrl.envs.math.problems import TEST_SHUFFLE_SEED, Problem, seeded_rng
from tinkrl.errors import ConfigError, short
from tinkrl.local.model_files import hub_offline

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
_HUB_TIMEOUT_S = 15.0
log = logging.getLogger(__name__)


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


def _load_hub(name: str, online: bool) -> dict[str | None, list[dict]]:
    import datasets

    src = SOURCES[name]
    out: dict[str | None, list[dict]] = {}
    with contextlib.nullcontext() if online else _hf_offline():
        for config in src.configs:
            for split in src.splits:
                ds = datasets.load_dataset(src.hf_id, config, split=split)
                out.setdefault(split, []).extend(ds.to_list())
    return out


def _missing(name: str, reason: str) -> ConfigError:
    import datasets
    import huggingface_hub.constants as hub_constants

    src = SOURCES[name]
    configs = [c for c in src.configs if c]
    which = f" (config{'s' if len(configs) > 1 else ''} {', '.join(configs)})" if configs else ""
    return ConfigError(
        f"{name}: dataset {src.hf_id}{which} is not available locally (looked in the HF caches "
        f"{hub_constants.HF_HUB_CACHE} and {datasets.config.HF_DATASETS_CACHE}) and cannot be downloaded "
        f"({reason}): run once where {hub_constants.ENDPOINT} is reachable (the download is cached), or set "
        f"env.data_path to a local copy: a directory of .parquet/.jsonl/.csv files with the split in their "
        f"names or folders, e.g. from `hf download --repo-type dataset {src.hf_id} --local-dir DIR`"
    )


def read_hf_cache(name: str) -> dict[str | None, list[dict]]:
    """Rows from the local HF cache by split, offline; ConfigError naming where it looked when absent."""
    try:
        return _load_hub(name, online=False)
    except Exception as e:  # noqa: BLE001  (datasets raises many types when a dataset is absent offline)
        raise _missing(name, f"reading the cache only; {type(e).__name__}") from None


def download(name: str) -> dict[str | None, list[dict]]:
    """Rows of a dataset preset by split, downloaded from the hub with HF `datasets` (and cached there, so
    the next run reads the cache); ConfigError (one line) when the hub cannot be reached or has no such
    dataset, or when downloads are off (`HF_HUB_OFFLINE=1`)."""
    import huggingface_hub.constants as hub_constants
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    src = SOURCES[name]
    if hub_offline() or hub_constants.HF_HUB_OFFLINE:
        raise _missing(name, "HF_HUB_OFFLINE=1 is set")
    endpoint = hub_constants.ENDPOINT
    try:  # one quick question first: `datasets` retries an unreachable hub for half a minute
        HfApi(endpoint=endpoint).dataset_info(src.hf_id, timeout=_HUB_TIMEOUT_S)
    except RepositoryNotFoundError as e:
        raise ConfigError(
            f"{name}: the hub at {endpoint} has no dataset {src.hf_id} or denies access [{type(e).__name__}]; "
            "set env.data_path to a local copy"
        ) from None
    except Exception as e:  # noqa: BLE001  (no DNS, refused, timed out, proxy, hub down: all "cannot reach it")
        raise _missing(name, f"the hub at {endpoint} cannot be reached: {short(e)}") from None
    log.warning("downloading dataset %s from %s into the HF cache (once)", src.hf_id, endpoint)
    try:
        return _load_hub(name, online=True)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(
            f"{name}: downloading dataset {src.hf_id} from {endpoint} failed ({short(e)}); run again, or set "
            "env.data_path to a local copy"
        ) from None


def _read(name: str, data_path: str | None) -> dict[str | None, list[dict]]:
    if data_path:
        configs = SOURCES[name].configs  # one named config (gsm8k: main/): prefer its folder
        return read_local(data_path, configs[0] if len(configs) == 1 else None)
    try:
        return read_hf_cache(name)
    except ConfigError:
        return download(name)


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
    """(train, test) problems of a dataset preset: local files, the HF cache or the hub (module docstring)."""
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

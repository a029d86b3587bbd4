"""Regenerate the generated tables of docs/performance.md and docs/runs.md from the
benchmarks' result JSON.

    python bench/report.py [--results DIR] [--doc FILE ...] [--check]

Every block lies between `<!-- generated: NAME -->` and `<!-- /generated -->` in one of the docs
(`--doc`, repeatable; by default both), and every block of `BLOCKS` must be in exactly one of
them. A benchmark's block is a table with fixed columns, one row per machine class and workload
(or per class and setting, summarising several runs), and the machines the rows were measured
on; `current` is performance.md's table of each machine class's headline figures. Everything
outside the blocks is prose and is kept as it is. A machine class the doc tracks without a
result gets a row saying which command measures it. `--check` rewrites nothing and exits 1 when
a block differs from what the JSON gives (a hand edit, or results not yet reported).

Result files are validated before rendering (bench/common.py writes them): a missing or
malformed field, a median that is not the median of its repeats, or a metric a table needs
stops the report with the file and field named.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import MACHINE_KEYS, RESULTS_DIR, ROOT

DOC = ROOT / "docs" / "performance.md"
RUNS = ROOT / "docs" / "runs.md"
DOCS = (DOC, RUNS)
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)
RECORD_KEYS = {"command", "commit", "date", "machine", "settings", "repeats", "median"}
# The machine classes the doc keeps figures for: the 2-core CPU `make train` is sized for, and a GPU.
CPU_REFERENCE = "cpu-amd-avx512_bf16-2c"
GPU_REFERENCE = "cuda-nvidia-h100-80gb-hbm3"


class ResultError(ValueError):
    """A result file that does not hold what bench/common.py writes."""


@dataclass(frozen=True)
class Record:
    """One workload's run, as read from `<results>/<bench>/<machine class>.json`."""

    machine_class: str
    workload: str
    command: str
    commit: str
    date: str
    machine: dict
    settings: dict
    repeats: dict[str, list[float]]
    median: dict[str, float]


@dataclass(frozen=True)
class Table:
    """How one benchmark's block looks: its columns after the machine class (commit and date
    follow them), the cells of a record's rows, and the metrics every record must have. With
    `per_class`, `rows` gets all of a machine class's records at once (for tables whose columns
    are records, such as one column per side and precision, or whose rows summarise several
    runs) and returns each row with the records it was made from; `stamp` makes the commit and
    date cells of those records (by default every record's commits and dates). The block is
    named `name`, by default the benchmark's."""

    bench: str
    command: str
    columns: tuple[str, ...]
    rows: Callable[[Any], list[Any]]  # Record -> rows; with per_class, list[Record] -> [(row, records)]
    needs: tuple[str, ...]
    machine_classes: tuple[str, ...] = (CPU_REFERENCE,)
    per_class: bool = False
    name: str = ""
    stamp: Callable[[list[Record]], tuple[str, str]] | None = None

    @property
    def block(self) -> str:
        return self.name or self.bench

    def markdown(self, results_dir: Path) -> str:
        return render(self, load(results_dir, self))


@dataclass(frozen=True)
class Summary:
    """A block made from several benchmarks' results (performance.md's `current`)."""

    block: str
    make: Callable[[Path], str]  # results dir -> the block's markdown

    def markdown(self, results_dir: Path) -> str:
        return self.make(results_dir)


# --- reading and checking result files ---------------------------------------------------


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_records(path: Path, bench: str, needs: Iterable[str] = ()) -> list[Record]:
    """The records of one result file, checked field by field."""

    def fail(what: str) -> ResultError:
        return ResultError(f"{path}: {what}")

    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise fail(f"not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("bench") != bench:
        raise fail(f"'bench' is not {bench!r}")
    if doc.get("machine_class") != path.stem:
        raise fail(f"'machine_class' is not the file's name {path.stem!r}")
    runs = doc.get("runs")
    if not isinstance(runs, dict) or not runs:
        raise fail("'runs' is not a non-empty object")
    out = []
    for workload, r in runs.items():
        where = f"run {workload!r}"
        if not isinstance(r, dict) or set(r) != RECORD_KEYS:
            got = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise fail(f"{where}: fields {got}, expected {sorted(RECORD_KEYS)}")
        if not isinstance(r["command"], str) or not r["command"]:
            raise fail(f"{where}: 'command' is not a command line")
        one = r"[0-9a-f]{7,40}(-dirty)?"  # several, comma-separated, for repeats made at several commits
        if not isinstance(r["commit"], str) or not re.fullmatch(rf"{one}(, {one})*|unknown", r["commit"]):
            raise fail(f"{where}: 'commit' {r['commit']!r} is not a short hash")
        if not isinstance(r["date"], str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]):
            raise fail(f"{where}: 'date' {r['date']!r} is not a day (YYYY-MM-DD)")
        if not isinstance(r["machine"], dict) or set(MACHINE_KEYS) - set(r["machine"]):
            raise fail(f"{where}: 'machine' lacks {sorted(set(MACHINE_KEYS) - set(r['machine'] or {}))}")
        if not isinstance(r["settings"], dict):
            raise fail(f"{where}: 'settings' is not an object")
        repeats, median = r["repeats"], r["median"]
        if not isinstance(repeats, dict) or not isinstance(median, dict) or set(repeats) != set(median):
            raise fail(f"{where}: 'repeats' and 'median' do not name the same metrics")
        for k, values in repeats.items():
            if not isinstance(values, list) or not values or not all(map(_is_number, values)):
                raise fail(f"{where}: repeats of {k!r} are not a non-empty list of numbers")
            if not _is_number(median[k]) or not math.isclose(median[k], statistics.median(values), rel_tol=1e-9):
                raise fail(f"{where}: median of {k!r} is {median[k]!r}, its repeats give {statistics.median(values)}")
        missing = [k for k in needs if k not in median]
        if missing:
            raise fail(f"{where}: no {missing}")
        out.append(Record(path.stem, workload, **r))
    return out


def load(results_dir: Path, table: Table) -> list[Record]:
    """Every record of one benchmark, by machine class then workload."""
    files = sorted((Path(results_dir) / table.bench).glob("*.json"))
    return [rec for f in files for rec in read_records(f, table.bench, table.needs)]


# --- rendering ---------------------------------------------------------------------------


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile, as the sandbox benchmarks print it."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def tok_s(x: float) -> str:
    return f"{x:,.0f}"


def describe(m: dict) -> str:
    """One line for a machine: CPU, cores and threads, RAM, GPU, torch."""
    parts = [f"{m['cpu_model']} ({m['cpu_class']}), {m['cores']} cores, {m['threads']} threads"]
    if m["ram_gib"] is not None:
        parts.append(f"{m['ram_gib']:g} GiB RAM")
    parts.append(m["gpu"] or "no GPU")
    parts.append(f"torch {m['torch']}" if m["torch"] else "no torch")
    return ", ".join(parts)


def every_commit_and_date(records: list[Record]) -> tuple[str, str]:
    """The commit and date cells of a row made from `records`: each commit and day once."""
    commits = ", ".join(dict.fromkeys(rec.commit for rec in records))
    return commits, ", ".join(dict.fromkeys(sorted(rec.date for rec in records)))


def last_day(records: list[Record]) -> tuple[str, str]:
    """The commit and date cells of a row summarising runs: the last day's commits, and the days
    from the first run to the last."""
    first, last = min(rec.date for rec in records), max(rec.date for rec in records)
    commits = ", ".join(dict.fromkeys(rec.commit for rec in records if rec.date == last))
    return commits, last if first == last else f"{first} to {last}"


def table_lines(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def render(table: Table, records: list[Record]) -> str:
    """The block's markdown: the table, then the machines its rows ran on."""
    header = ["machine class", *table.columns, "commit", "date"]
    lines = table_lines(header, [])
    if table.per_class:
        stamp = table.stamp or every_commit_and_date
        for cls in dict.fromkeys(rec.machine_class for rec in records):
            group = [rec for rec in records if rec.machine_class == cls]
            for cells, made_from in table.rows(group):
                lines.append("| " + " | ".join([f"`{cls}`", *cells, *stamp(made_from)]) + " |")
    else:
        for rec in records:
            for cells in table.rows(rec):
                lines.append("| " + " | ".join([f"`{rec.machine_class}`", *cells, rec.commit, rec.date]) + " |")
    measured = {rec.machine_class for rec in records}
    for cls in table.machine_classes:
        if cls not in measured:
            note = f"not yet measured on this machine class: run `{table.command}`"
            lines.append("| " + " | ".join([f"`{cls}`", note, *[""] * (len(header) - 2)]) + " |")
    machines = sorted({(rec.machine_class, describe(rec.machine)) for rec in records})
    if machines:
        lines += ["", "Measured on:"] + [f"- `{cls}`: {text}" for cls, text in machines]
    return "\n".join(lines) + "\n"


def engine_rows(r: Record) -> list[list[str]]:
    m = r.median

    def train(kind: str) -> str:
        ours, peft = m.get(f"train_{kind}/tinkrl_tok_s"), m.get(f"train_{kind}/peft_tok_s")
        return f"{tok_s(ours)} / {tok_s(peft)} ({ratio(ours, peft)})" if ours and peft else "not run"

    conc, gen = m["sampling/tinkrl_concurrent_tok_s"], m["sampling/hf_generate_tok_s"]
    return [
        [
            str(r.settings.get("model")),
            str(r.settings.get("precision")),
            tok_s(conc),
            tok_s(m["sampling/tinkrl_prebatched_tok_s"]),
            tok_s(m["sampling/tinkrl_lora_concurrent_tok_s"]),
            tok_s(gen),
            ratio(conc, gen),
            train("grouped"),
            train("distinct"),
        ]
    ]


def vs_trl_rows(r: Record) -> list[list[str]]:
    ours, trl = r.median["tinkrl_step_s"], r.median["trl_step_s"]
    steps = len(r.repeats["tinkrl_step_s"])
    return [[str(r.settings.get("precision")), str(steps), f"{ours:.2f}", f"{trl:.2f}", ratio(trl, ours)]]


def vs_trl_accuracy_rows(r: Record) -> list[list[str]]:
    def cell(system: str, lr: str) -> str:
        acc, steps = r.median.get(f"{system}/{lr}/greedy_correct"), r.median.get(f"{system}/{lr}/steps")
        return f"{steps:.0f}, {acc:.2f}" if acc is not None and steps is not None else "not run"

    lrs = sorted({k.split("/")[1] for k in r.median}, key=float)
    wall = f"{r.settings.get('wall_s', 0):.0f}"
    return [[str(r.settings.get("precision")), wall, lr, cell("tinkrl", lr), cell("trl", lr)] for lr in lrs]


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def make_train_rows(r: Record) -> list[list[str]]:
    m, s = r.median, r.settings
    step = f"{m['late_step_s']:.2f} ({m['late_sample_s']:.2f} + {m['late_train_s']:.2f})"
    greedy = f"{m['greedy_before']:.2f} -> {m['greedy_after']:.2f}" if "greedy_after" in m else "no eval"
    sampled = f"{m['sampled_after']:.2f}" if "sampled_after" in m else "no eval"
    rollouts = str(s.get("batch_size"))
    sampler = sampler_of(r)
    return [
        [str(s.get("model_name")), sampler, rollouts, f"{m['steps']:.0f}", step, greedy, sampled, minutes(m["wall_s"])]
    ]


def sampler_of(r: Record) -> str:
    return str(r.settings.get("sampler_precision", "matched"))  # runs recorded before the field sampled matched


def spread(values: list[float], fmt: str) -> str:
    """`median (lowest-highest)` of several runs' figures; one run's figure alone."""
    med = format(statistics.median(values), fmt)
    if len(values) == 1:
        return med
    return f"{med} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def start_of(r: Record) -> str:
    """How a `make train` run started: `fresh clone` (a new user's make install, then make train, caches
    empty first) or `as found` (whatever the machine held; every run recorded before the field)."""
    return str(r.settings.get("start", "as found"))


def by_setting(records: list[Record]) -> dict[tuple[str, str, str], list[Record]]:
    """`make train` runs by model, sampler precision and start, the runs a summary row may pool."""

    def key(r: Record) -> tuple[str, str, str]:
        return str(r.settings.get("model_name")), sampler_of(r), start_of(r)

    return {k: [r for r in records if key(r) == k] for k in sorted({key(r) for r in records})}


def make_train_summary_rows(records: list[Record]) -> list[tuple[list[str], list[Record]]]:
    """One row per model and sampler precision: how many runs, and the median (lowest-highest)
    of each figure over them."""
    rows = []
    for (model, sampler, start), runs in by_setting(records).items():

        def of(metric: str, fmt: str, runs: list[Record] = runs) -> str:
            values = [r.median[metric] for r in runs if metric in r.median]
            return spread(values, fmt) if values else "no eval"

        wall = minutes(statistics.median([r.median["wall_s"] for r in runs]))
        cells = [model, sampler, start, str(len(runs)), of("steps", ".0f"), of("late_step_s", ".2f")]
        rows.append((cells + [of("greedy_after", ".2f"), of("sampled_after", ".2f"), wall], runs))
    return rows


def training_memory_rows(r: Record) -> list[list[str]]:
    """One row per sequence length: the step's seconds and tokens/s, its peak memory and that per token."""
    m, s = r.median, r.settings
    system = " ".join(str(x) for x in (s.get("system"), s.get("label")) if x)
    lengths = sorted({int(k.split("/")[0]) for k in m if k.endswith("/seconds")})
    return [
        [
            str(s.get("model")),
            system,
            str(s.get("allocator", "glibc")),
            str(n),
            f"{m[f'{n}/seconds']:.1f}",
            f"{m[f'{n}/tok_s']:.0f}",
            f"{m[f'{n}/peak_gb']:.2f}",
            f"{m[f'{n}/peak_mb_per_token']:.2f}",
        ]
        for n in lengths
    ] + [
        [str(s.get("model")), system, str(s.get("allocator", "glibc")), n, f"did not run: {why}", "", "", ""]
        for n, why in (s.get("failed") or {}).items()
    ]


def trainer_memory_rows(r: Record) -> list[list[str]]:
    """One row per tree: the trainer's peak RSS and each step's seconds (medians over the repeats)."""
    m = r.median
    steps = sorted({k.split("/")[0] for k in m if k.startswith("step")})
    times = ", ".join(f"{m[f'{s}/sample_s']:.1f} + {m[f'{s}/train_s']:.1f} = {m[f'{s}/step_s']:.1f}" for s in steps)
    return [[r.workload, str(len(r.repeats["max_rss_gb"])), f"{m['max_rss_gb']:.2f}", times]]


def sweep_rows(r: Record) -> list[list[str]]:
    m, rows = r.median, []
    for name, overrides in (r.settings.get("variants") or {}).items():
        if f"{name}/steps" not in m:
            rows.append([r.workload, name, " ".join(overrides) or "(defaults)", "failed", "", "", ""])
            continue
        final = f"{m[f'{name}/final_greedy']:.2f}" if f"{name}/final_greedy" in m else "no eval"
        best = (
            f"{m[f'{name}/best_greedy']:.2f} (step {m[f'{name}/best_step']:.0f})"
            if f"{name}/best_greedy" in m
            else "no eval"
        )
        steps = f"{m[f'{name}/steps']:.0f}"
        rows.append(
            [r.workload, name, " ".join(overrides) or "(defaults)", steps, final, best, minutes(m[f"{name}/wall_s"])]
        )
    return rows


def sandbox_rows(r: Record) -> list[list[str]]:
    rep, n = r.repeats, str(r.settings.get("concurrent"))
    seq = rep["sequential_s"]
    gap = rep.get("sequential_idle_gap_s")
    gap_cell = f"{ms(percentile(gap, 0.5))} / {ms(percentile(gap, 0.99))}" if gap else "—"
    burst = rep["at_once_cycle_s"]
    return [
        [
            r.workload,
            f"{ms(percentile(seq, 0.5))} / {ms(percentile(seq, 0.99))}",
            ms(statistics.mean(seq)),
            gap_cell,
            n,
            ms(r.median["at_once_wall_s"]),
            f"{ms(percentile(burst, 0.5))} / {ms(percentile(burst, 0.99))}",
        ]
    ]


def sandbox_containers_rows(r: Record) -> list[list[str]]:
    rep, med = r.repeats, r.median

    def p50_p90(k: str) -> str:
        return f"{ms(med[k])} / {ms(percentile(rep[k], 0.9))}"

    return [
        [
            r.workload,
            p50_p90("create_s"),
            p50_p90("exec_true_s"),
            ms(med["write_read_1mib_s"]),
            ms(med["close_s"]),
            str(r.settings.get("concurrent")),
            f"{med['at_once_wall_s']:.2f}",
            f"{med['at_once_cycle_s']:.2f}",
        ]
    ]


TINKER_CALLS = ("forward_backward", "optim_step", "sample (4 tokens)")


def tinker_server_rows(r: Record) -> list[list[str]]:
    m, rep = r.median, r.repeats
    local, server = m["rl_step_local_s"], m["rl_step_server_s"]

    def added(call: str) -> str:
        lo, hi = rep[f"{call}/local_ms"], rep[f"{call}/server_ms"]
        return f"{m[f'{call}/server_ms'] - m[f'{call}/local_ms']:+.1f} / {min(hi) - min(lo):+.1f}"

    overhead = f"{(server / local - 1) * 100:+.1f} %"
    return [[r.workload, f"{local:.3f}", f"{server:.3f}", overhead, *(added(c) for c in TINKER_CALLS)]]


def proxy_load_rows(r: Record) -> list[list[str]]:
    m = r.median
    seq, con = m["sequential/tok_per_s"], m["concurrent/tok_per_s"]
    failed = sum(r.repeats["concurrent/errors"])
    requests = r.settings.get("concurrent", 0) * len(r.repeats["concurrent/errors"])
    return [
        [
            r.workload,
            f"{seq:.1f} ({m['sequential/req_per_s']:.2f})",
            str(r.settings.get("concurrent")),
            f"{con:.1f} ({m['concurrent/req_per_s']:.2f})",
            f"{m['concurrent/wall_s']:.2f}",
            f"{failed:.0f} / {requests}",
            ratio(con, seq),
        ]
    ]


VS_VLLM_COLUMNS = (
    ("tinkrl", "float32"),
    ("tinkrl", "float32+bfloat16-sampler"),
    ("vllm", "bfloat16"),
    ("vllm", "float32"),
)


# A part of the plan, and the variant that hands it back to the reference's way (bench/sampler_paths.py).
PATH_PARTS = (
    ("one call a layer", "op by op"),
    ("kernel products", "oneDNN products"),
    ("bf16 head", "fp32 head"),
    ("kernel prefill", "reference prefill"),
)


def paired(r: Record, slower: str, faster: str) -> str:
    """How much faster `faster` ran than `slower`, round by round (both ran in every round): the median
    of the rounds' ratios and their lowest and highest, "pays" where it was faster in every round."""
    ratios = [a / b for a, b in zip(r.repeats[slower], r.repeats[faster])]
    verdict = ", pays" if min(ratios) > 1 else ""
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}{verdict})"


def sampler_paths_rows(r: Record) -> list[list[str]]:
    """One row per sampler and workload: the reference's seconds a call, the plan's speed against the
    reference, and each part's: the plan against the plan with that part handed back ("-" where the
    plan has no such part), each round by round (`paired`)."""
    sampler, _, workload = r.workload.partition(" ")
    parts = [paired(r, variant, "plan") if variant in r.repeats else "-" for _, variant in PATH_PARTS]
    return [[sampler, workload, f"{r.median['reference']:.2f}", paired(r, "reference", "plan"), *parts]]


def vs_vllm_cells(records: list[Record]) -> list[list[str]]:
    """One row per workload and one for start-up; a column per (side, precision), then tinkrl's
    best over vLLM at its default (bf16): tokens/s over tokens/s, or for start-up vLLM's seconds
    over tinkrl's (above 1: tinkrl faster)."""
    by = {(r.settings.get("side"), r.settings.get("precision")): r.median for r in records}
    specs: dict[str, dict] = {}
    for r in records:
        for w, spec in sorted((r.settings.get("workloads") or {}).items()):
            specs.setdefault(w, spec)

    def label(w: str, spec: dict) -> str:
        p, n, t = spec.get("prompts"), spec.get("samples"), spec.get("tokens")
        if spec.get("turns"):
            return f"{w}: {p} episodes x {spec['turns']} turns x {t} tok"
        return f"{w}: {p} x {t} tok" if n == 1 else f"{w}: {p} prompts x {n} samples x {t} tok"

    def row(name: str, metric: str, fmt: Callable[[float], str], higher_better: bool) -> list[str]:
        got = {k: m[metric] for k, m in by.items() if metric in m}
        cells = [fmt(got[k]) if k in got else "—" for k in VS_VLLM_COLUMNS]
        ours = [v for (side, _), v in got.items() if side == "tinkrl"]
        ref = got.get(("vllm", "bfloat16"))
        if not ours or ref is None:
            return [name, *cells, "—"]
        best = max(ours) if higher_better else min(ours)
        return [name, *cells, ratio(best, ref) if higher_better else ratio(ref, best)]

    rows = [row(label(w, spec), f"{w}/tok_s", tok_s, True) for w, spec in sorted(specs.items())]
    return rows + [row("start-up s (to first sample)", "startup_s", lambda x: f"{x:.1f}", False)]


def vs_vllm_rows(records: list[Record]) -> list[tuple[list[str], list[Record]]]:
    return [(cells, records) for cells in vs_vllm_cells(records)]


MAKE_TRAIN_NEEDS = ("late_step_s", "late_sample_s", "late_train_s", "steps", "wall_s")


def make_train_agent_rows(r: Record) -> list[list[str]]:
    """One row per record: medians over its runs (one standard error each), the RL figures' range when
    there are several runs."""
    m, runs = r.median, r.repeats["rl_steps"]

    def tag(name: str) -> str:
        if f"{name}/rl" not in m:
            return "no eval"
        ws = f"{m[f'{name}/warm_start']:.2f} ± {m[f'{name}/warm_start_stderr']:.2f}"
        return f"{ws} -> {spread(r.repeats[f'{name}/rl'], '.2f')} ± {m[f'{name}/rl_stderr']:.2f}"

    return [
        [
            str(r.settings.get("model_name")),
            str(len(runs)),
            spread(runs, ".0f"),
            minutes(m["wall_s"]),
            f"{m['eval_share']:.0%}",
            tag("heldout_instances"),
            tag("handwritten"),
            tag("heldout_templates"),
        ]
    ]


def distill_rows(r: Record) -> list[list[str]]:
    """One row per distillation config: the teacher's held-out greedy accuracy, the student's before and after
    (medians over the runs, the range of the after figure, one run's standard error), its steps and wall
    time beside the RL run's, and the wall-time ratio."""
    m = r.median

    def acc(name: str) -> str:
        return f"{m[name]:.2f} ± {m[f'{name}_stderr']:.2f}"

    teacher = r.settings.get("teacher") or {}
    return [
        [
            str(r.settings.get("model_name")),
            f"{teacher.get('model')} (kl_coef {teacher.get('kl_coef')}, reward_coef {teacher.get('reward_coef')})",
            f"{r.settings.get('batch_size')}, lr {r.settings.get('learning_rate')}",
            acc("teacher_greedy"),
            str(len(r.repeats["steps"])),
            f"{acc('greedy_before')} -> {spread(r.repeats['greedy_after'], '.2f')} ± {m['greedy_after_stderr']:.2f}",
            f"{m['steps']:.0f} in {minutes(m['wall_s'])}",
            f"{m['rl_steps']:.0f} in {minutes(m['rl_wall_s'])}",
            f"{m['wall_ratio']:.2f}",
        ]
    ]


def dpo_rows(r: Record) -> list[list[str]]:
    """One row per DPO config: its pairs and settings, the held-out greedy accuracy before and after (medians
    over the runs, the range of the after figure, one run's standard error), steps and wall, beside RL's
    before and after and wall from the same start."""
    m, d = r.median, r.settings.get("dpo") or {}

    def acc(name: str) -> str:
        return f"{m[name]:.2f} ± {m[f'{name}_stderr']:.2f}"

    return [
        [
            str(r.settings.get("model_name")),
            f"{m['pairs']:.0f} from {d.get('pairs')} (first {d.get('run_steps')} steps)",
            f"{d.get('group_pairs') or 'best_worst'}, beta {d.get('beta')}, reference {d.get('reference')}, "
            f"{r.settings.get('batch_size')} pairs/step, lr {r.settings.get('learning_rate')}",
            str(len(r.repeats["steps"])),
            f"{acc('greedy_before')} -> {spread(r.repeats['greedy_after'], '.2f')} ± {m['greedy_after_stderr']:.2f}",
            f"{m['steps']:.0f} in {minutes(m['wall_s'])}",
            f"{acc('rl_greedy_before')} -> {acc('rl_greedy_after')}",
            f"{m['rl_steps']:.0f} in {minutes(m['rl_wall_s'])}",
        ]
    ]


MERGE_AGENTS = (  # the bench's environment keys: the agent and how it is plugged in
    ("mini_text", "mini-swe-agent, text (`mini_textbased.yaml`)", "`agent: mini-swe-agent`, `mini_mode: text`"),
    ("mini_tools", "mini-swe-agent, tool calls (`mini.yaml`)", "`agent: mini-swe-agent`, `mini_mode: tools`"),
    ("openai_tools", "plain OpenAI tool-calling agent (`scripts/openai_tools_agent.py`)", "`agent: command`"),
)
MERGE_METRICS = ("calls", "merge_rate", "datums", "splice_rate", "truncated", "reward")


def merge_rate_rows(r: Record) -> list[list[str]]:
    """One row per agent: calls, merge rate, datums and splice rate per rollout, truncated turns and
    reward (medians over the runs of each run's mean over its steps)."""
    m, rows = r.median, []
    for key, agent, plugged in MERGE_AGENTS:
        cells = [f"{m[f'{key}/{name}']:.2f}" for name in MERGE_METRICS[:4]]
        rows.append([agent, plugged, *cells, f"{m[f'{key}/truncated']:.0%}", f"{m[f'{key}/reward']:.2f}"])
    return rows


TABLES = (
    Table(
        "make_train",
        "make train && python bench/make_train.py",
        (
            "model",
            "sampler",
            "start",
            "runs",
            "steps in budget",
            "late s/step",
            "held-out greedy after",
            "sampled after",
            "wall (median)",
        ),
        make_train_summary_rows,
        MAKE_TRAIN_NEEDS,
        per_class=True,
        stamp=last_day,
    ),
    Table(
        "make_train",
        "make train && python bench/make_train.py",
        (
            "model",
            "sampler",
            "rollouts/step",
            "steps in budget",
            "late s/step (sample + train)",
            "held-out greedy before -> after",
            "sampled after",
            "wall",
        ),
        make_train_rows,
        MAKE_TRAIN_NEEDS,
        name="make_train_runs",
    ),
    Table(
        "make_train_agent",
        "make train-agent && python bench/make_train_agent.py",
        (
            "model",
            "runs",
            "RL steps in budget",
            "wall",
            "eval share",
            "held-out instances: warm start -> RL",
            "hand-written tasks: warm start -> RL",
            "held-out templates: warm start -> RL",
        ),
        make_train_agent_rows,
        ("rl_steps", "wall_s", "eval_share"),
        machine_classes=(CPU_REFERENCE, "cpu-amd-avx2-2c"),
    ),
    Table(
        "distill",
        "make train && make distill && python bench/distill.py",
        (
            "student",
            "teacher",
            "rollouts/step, lr",
            "teacher held-out greedy",
            "runs",
            "student held-out greedy before -> after",
            "distillation: steps in wall",
            "RL: steps in wall",
            "wall / RL's",
        ),
        distill_rows,
        ("teacher_greedy", "greedy_before", "greedy_after", "steps", "wall_s", "rl_steps", "rl_wall_s", "wall_ratio"),
    ),
    Table(
        "dpo",
        "make train && make dpo && python bench/dpo.py",
        (
            "model",
            "pairs",
            "settings",
            "runs",
            "held-out greedy before -> after",
            "DPO: steps in wall",
            "RL: held-out greedy before -> after",
            "RL: steps in wall",
        ),
        dpo_rows,
        ("pairs", "greedy_before", "greedy_after", "steps", "wall_s", "rl_greedy_after", "rl_steps", "rl_wall_s"),
    ),
    Table(
        "vs_trl",
        "python bench/vs_trl.py --steps 8 --precision float32",
        ("precision", "steps timed", "tinkrl s/step", "TRL s/step", "speedup"),
        vs_trl_rows,
        ("tinkrl_step_s", "trl_step_s"),
    ),
    Table(
        "vs_trl_accuracy",
        "python bench/vs_trl.py --accuracy --wall 300 --precision float32",
        ("precision", "wall s", "learning rate", "tinkrl: steps, held-out greedy", "TRL: steps, held-out greedy"),
        vs_trl_accuracy_rows,
        (),
    ),
    Table(
        "engine",
        "python bench/engine.py",
        (
            "model",
            "precision",
            "concurrent tok/s",
            "pre-batched tok/s",
            "LoRA tok/s",
            "HF generate tok/s",
            "concurrent / generate",
            "train grouped tinkrl / peft tok/s",
            "train distinct tinkrl / peft tok/s",
        ),
        engine_rows,
        (
            "sampling/tinkrl_concurrent_tok_s",
            "sampling/tinkrl_prebatched_tok_s",
            "sampling/tinkrl_lora_concurrent_tok_s",
            "sampling/hf_generate_tok_s",
        ),
        (CPU_REFERENCE, GPU_REFERENCE),
    ),
    Table(
        "training_memory",
        "python bench/training_memory.py",
        ("model", "system", "allocator", "tokens", "step s", "tokens/s", "peak GB", "peak MB/token"),
        training_memory_rows,
        (),
    ),
    Table(
        "merge_rate",
        "python bench/merge_rate.py",
        (
            "agent",
            "how plugged in",
            "calls / rollout",
            "merge_rate",
            "datums / rollout",
            "splice_rate",
            "truncated turns",
            "reward",
        ),  # fmt: skip
        merge_rate_rows,
        tuple(f"{key}/{name}" for key, _, _ in MERGE_AGENTS for name in MERGE_METRICS),
    ),
    Table(
        "trainer_memory",
        "python bench/trainer_memory.py",
        ("run", "runs", "trainer max RSS GB", "steps: sample + train = step s"),
        trainer_memory_rows,
        (),
    ),
    Table(
        "sweep",
        "python bench/sweep.py --out runs/sweep --variant NAME KEY=VALUE ...",
        ("sweep", "variant", "overrides", "steps", "final greedy", "best greedy", "wall"),
        sweep_rows,
        (),
        (GPU_REFERENCE,),
    ),
    Table(
        "sampler_paths",
        "python bench/sampler_paths.py",
        (
            "sampler",
            "workload",
            "reference s/call",
            "plan vs reference",
            *(f"{part}" for part, _ in PATH_PARTS),
        ),
        sampler_paths_rows,
        ("plan", "reference"),
        per_class=False,
    ),
    Table(
        "vs_vllm",
        "bash bench/vllm_cpu_venv.sh && python bench/vs_vllm.py",
        (
            "workload",
            "tinkrl fp32 tok/s",
            "tinkrl bf16 sampler tok/s",
            "vLLM bf16 tok/s",
            "vLLM fp32 tok/s",
            "tinkrl best / vLLM bf16",
        ),
        vs_vllm_rows,
        ("startup_s",),
        per_class=True,
    ),
    Table(
        "sandbox",
        "python bench/sandbox.py",
        (
            "provider, mode",
            "sequential p50 / p99 ms",
            "sequential mean ms",
            "idle gap p50 / p99 ms",
            "at once",
            "at once: wall ms",
            "at once: cycle p50 / p99 ms",
        ),
        sandbox_rows,
        ("sequential_s", "at_once_cycle_s", "at_once_wall_s"),
    ),
    Table(
        "sandbox_containers",
        "python bench/sandbox_containers.py --runs 15 --concurrent 8",
        (
            "provider",
            "create p50 / p90 ms",
            "exec `true` p50 / p90 ms",
            "1 MiB write + read p50 ms",
            "close p50 ms",
            "at once",
            "at once: wall s",
            "at once: cycle p50 s",
        ),
        sandbox_containers_rows,
        ("create_s", "exec_true_s", "write_read_1mib_s", "close_s", "at_once_cycle_s", "at_once_wall_s"),
    ),
    Table(
        "tinker_server",
        "python bench/tinker_server.py",
        (
            "model",
            "RL step in-process s",
            "RL step through server s",
            "server overhead",
            *(f"{c} added ms (median / min)" for c in TINKER_CALLS),
        ),
        tinker_server_rows,
        ("rl_step_local_s", "rl_step_server_s", *(f"{c}/{s}_ms" for c in TINKER_CALLS for s in ("local", "server"))),
    ),
    Table(
        "proxy_load",
        "python bench/proxy_load.py --runs 3",
        (
            "model",
            "sequential tok/s (req/s)",
            "at once",
            "at once tok/s (req/s)",
            "at once wall s",
            "failed",
            "speed-up",
        ),
        proxy_load_rows,
        (
            "sequential/tok_per_s",
            "sequential/req_per_s",
            "concurrent/tok_per_s",
            "concurrent/req_per_s",
            "concurrent/wall_s",
            "concurrent/errors",
        ),
    ),
)


# --- the headline figures of every machine class ------------------------------------------

HEADLINE_BENCHES = ("make_train", "vs_vllm", "engine", "vs_trl")


def current_block(results_dir: Path) -> str:
    """performance.md's first table: for each machine class with a record of a headline
    benchmark, one row per benchmark and setting with its headline figures. `make train` rows are
    medians over the class's runs with one sampler precision; the other benchmarks keep one
    record per class and workload, their latest."""
    tables = {t.block: t for t in TABLES}
    rows: dict[str, list[list[str]]] = {}

    def add(cls: str, what: str, figure: str, made_from: list[Record]) -> None:
        rows.setdefault(cls, []).append([f"`{cls}`", what, figure, *every_commit_and_date(made_from)])

    def by_class(bench: str) -> dict[str, list[Record]]:
        out: dict[str, list[Record]] = {}
        for rec in load(results_dir, tables[bench]):
            out.setdefault(rec.machine_class, []).append(rec)
        return out

    for cls, records in by_class("make_train").items():
        settings = by_setting(records)
        for (model, sampler, start), runs in settings.items():

            def med(metric: str, runs: list[Record] = runs) -> float | None:
                values = [r.median[metric] for r in runs if metric in r.median]
                return statistics.median(values) if values else None

            before, after = med("greedy_before"), med("greedy_after")
            learned = (
                f"held-out greedy {before:.2f} -> {after:.2f}"
                if before is not None and after is not None
                else "no eval"
            )
            figure = f"{med('steps'):.0f} steps in the budget, {learned}, late steps {med('late_step_s'):.2f} s/step"
            runs_note = f"median of {len(runs)} runs" if len(runs) > 1 else "1 run"
            of_model = f", {model}" if len({m for m, _, _ in settings}) > 1 else ""  # named when the class ran several
            fresh = ", fresh clone" if start == "fresh clone" else ""
            what = f"`make train`{of_model}, {sampler} sampler{fresh} ({runs_note})"
            commits, date = last_day(runs)
            rows.setdefault(cls, []).append([f"`{cls}`", what, figure, commits, date])

    for cls, records in by_class("vs_vllm").items():
        ratios = [f"{name.split(':')[0]} {cells[-1]}" for name, *cells in vs_vllm_cells(records)]
        workloads, startup = ratios[:-1], ratios[-1].removeprefix("start-up s (to first sample) ")
        figure = f"tinkrl's best / vLLM's bf16 tokens/s: {', '.join(workloads)}; start-up {startup} faster"
        add(cls, "sampling vs vLLM", figure, records)

    for cls, records in by_class("engine").items():
        for r in records:
            m = r.median
            figure = f"sampling {ratio(m['sampling/tinkrl_concurrent_tok_s'], m['sampling/hf_generate_tok_s'])} HF `generate`"
            kinds = [
                k for k in ("grouped", "distinct") if f"train_{k}/tinkrl_tok_s" in m and f"train_{k}/peft_tok_s" in m
            ]
            if kinds:
                train = " / ".join(ratio(m[f"train_{k}/tinkrl_tok_s"], m[f"train_{k}/peft_tok_s"]) for k in kinds)
                figure += f"; LoRA training {train} peft ({' / '.join(kinds)})"
            weights = ", random weights" if str(r.settings.get("model")).startswith("random") else ""
            add(cls, f"engine vs transformers/peft, {r.settings.get('precision')}{weights}", figure, [r])

    for cls, records in by_class("vs_trl").items():
        for r in records:
            ours, trl = r.median["tinkrl_step_s"], r.median["trl_step_s"]
            figure = f"an RL step {ratio(trl, ours)} faster ({ours:.2f} against {trl:.2f} s)"
            add(cls, f"vs TRL's GRPOTrainer, {r.settings.get('precision')}", figure, [r])

    header = ["machine class", "benchmark", "headline figures", "commit", "date"]
    return "\n".join(table_lines(header, [row for cls in sorted(rows) for row in rows[cls]])) + "\n"


BLOCKS: tuple[Table | Summary, ...] = (Summary("current", current_block), *TABLES)


# --- the docs ----------------------------------------------------------------------------


def regenerate(text: str, results_dir: Path, blocks: Iterable[Table | Summary] = BLOCKS) -> str:
    """`text` with each of its generated blocks rendered from `results_dir`. A block whose name
    `blocks` lacks, or one that appears twice, is an error; which blocks a set of docs must hold
    between them, `regenerate_docs` checks."""
    by_name = {b.block: b for b in blocks}
    found = [m.group("name") for m in BLOCK.finditer(text)]
    unknown = sorted(set(found) - set(by_name))
    twice = sorted({n for n in found if found.count(n) > 1})
    if unknown or twice:
        raise ResultError(f"generated blocks: unknown {unknown}, twice {twice}")

    def block(m: re.Match) -> str:
        return m.group(1) + by_name[m.group("name")].markdown(results_dir) + m.group(4)

    return BLOCK.sub(block, text)


def regenerate_docs(
    texts: dict[Path, str], results_dir: Path, blocks: Iterable[Table | Summary] = BLOCKS
) -> dict[Path, str]:
    """Every doc with its blocks rendered; every block must be in exactly one of the docs."""
    blocks = tuple(blocks)
    where: dict[str, list[str]] = {}
    for path, text in texts.items():
        for m in BLOCK.finditer(text):
            where.setdefault(m.group("name"), []).append(path.name)
    missing = sorted(b.block for b in blocks if b.block not in where)
    twice = sorted(f"{name} ({', '.join(docs)})" for name, docs in where.items() if len(docs) > 1)
    if missing or twice:
        raise ResultError(f"generated blocks: missing {missing}, in more than one place {twice}")
    return {path: regenerate(text, results_dir, blocks) for path, text in texts.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS_DIR)
    ap.add_argument(
        "--doc", type=Path, action="append", help="a doc holding generated blocks (repeatable; default: both docs)"
    )
    ap.add_argument("--check", action="store_true", help="exit 1 when a doc's generated blocks are out of date")
    args = ap.parse_args(argv)
    docs = args.doc or list(DOCS)
    texts = {doc: doc.read_text() for doc in docs}
    try:
        new = regenerate_docs(texts, args.results)
    except ResultError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    changed = [doc for doc in docs if new[doc] != texts[doc]]
    if not changed:
        print(f"{', '.join(map(str, docs))}: generated blocks are up to date")
        return 0
    if args.check:
        for doc in changed:
            old = {m.group("name"): m.group("body") for m in BLOCK.finditer(texts[doc])}
            stale = [m.group("name") for m in BLOCK.finditer(new[doc]) if old.get(m.group("name")) != m.group("body")]
            print(f"{doc}: generated blocks differ from the results: {', '.join(stale)}", file=sys.stderr)
        print("run `python bench/report.py` (never edit between the generated markers)", file=sys.stderr)
        return 1
    for doc in changed:
        doc.write_text(new[doc])
        print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

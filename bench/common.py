"""What every benchmark records next to its figures, and where it writes them.

Each `bench/*.py` run writes one JSON file per benchmark and machine class,
`bench/results/<bench>/<machine class>.json`, which `bench/report.py` turns into the tables of
docs/performance.md. A file holds one record per workload (a model, a precision, a provider),
so measuring a second workload on the same machine class adds a record instead of replacing the
first. A record is the command line, the commit, the day, the machine, the settings, every raw
repeat of every metric and their medians; ratios are left to the report, which takes them from
the medians.

The machine class is what makes figures comparable: `cpu-<vendor>-<class>-<N>c` for work on N
CPU cores, the vendor being `amd`, `intel` or `other` and the class the fastest matrix
instructions the CPU has (`amx`, `avx512_bf16`, `avx2`, `other`), or `cuda-<gpu name>` for work
on a GPU. The vendor is part of it because one instruction class runs at different speeds on
different makers' cores: an AMD EPYC and an Intel Xeon both have AVX512-BF16, and their bf16 dot
products and fp32 FMAs compare the other way round.

Results go to `--results DIR`, else `$TINKRL_BENCH_RESULTS`, else the committed
`bench/results/`: point either at a temporary directory for trial runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path

from tinkrl.local.compute_plan import cpuinfo, usable_flags, vendor_of  # no torch: the report runs without it

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
RESULTS_ENV = "TINKRL_BENCH_RESULTS"
# Files a benchmark run rewrites itself: changing them does not make the code under test "dirty".
GENERATED_PATHS = ("bench/results", "docs/performance.md", "docs/runs.md")
MACHINE_KEYS = ("cpu_model", "cpu_vendor", "cpu_class", "cores", "threads", "ram_gib", "gpu", "torch")


def cpu_class(flags: set[str]) -> str:
    """The CPU's fastest matrix-instruction class, from its /proc/cpuinfo flags."""
    if {"amx_tile", "amx_bf16"} & flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx2" in flags:
        return "avx2"
    return "other"


def _cpuinfo() -> tuple[str, str, set[str]]:
    """(model name, vendor, flags) of the first CPU in /proc/cpuinfo; the platform's name elsewhere. Under
    `ONEDNN_MAX_CPU_ISA` the flags are those the libraries may use (and the model name says so), so a
    run with AVX-512 masked off is recorded as its class's."""
    info, cap = cpuinfo(), os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    model = info.get("model name") or platform.processor() or platform.machine()
    flags = set(usable_flags(frozenset(info.get("flags", "").split()), cap)[0])
    return model + (f" (ONEDNN_MAX_CPU_ISA={cap})" if cap else ""), vendor_of(info.get("vendor_id", "")), flags


def _ram_gib() -> float | None:
    try:
        m = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return round(int(m.group(1)) / 2**20, 1) if m else None


def _gpu_name() -> str | None:
    """The first GPU's name, from torch when the benchmark loaded it, else from nvidia-smi."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=False
        )
        names = out.stdout.strip().splitlines()
        return names[0].strip() if out.returncode == 0 and names else None
    return None


def _torch_version() -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """The machine a benchmark ran on: CPU model, vendor and class, cores available, threads torch
    used (the cores when torch is not loaded), RAM in GiB, GPU name (None without one), torch
    version."""
    model, vendor, flags = _cpuinfo()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch = sys.modules.get("torch")
    return {
        "cpu_model": model,
        "cpu_vendor": vendor,
        "cpu_class": cpu_class(flags),
        "cores": cores,
        "threads": torch.get_num_threads() if torch is not None else cores,
        "ram_gib": _ram_gib(),
        "gpu": _gpu_name(),
        "torch": _torch_version(),
    }


def machine_class(info: Mapping, device: str = "cpu") -> str:
    """`cuda-<gpu>` for work on a GPU, else `cpu-<vendor>-<cpu class>-<cores>c`."""
    if device.startswith("cuda") and info.get("gpu"):
        return "cuda-" + re.sub(r"[^a-z0-9]+", "-", info["gpu"].lower()).strip("-")
    return f"cpu-{info['cpu_vendor']}-{info['cpu_class']}-{info['cores']}c"


def commit() -> str:
    """`git rev-parse --short HEAD`, with `-dirty` when tracked code differs from it (results and
    the generated doc excepted); "unknown" outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{p}" for p in GENERATED_PATHS))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed else "")


# The commit a benchmark runs: taken when the script imports this module, so that edits made while
# a long benchmark runs are not credited to it.
COMMIT_AT_START = commit()


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as a user would type it from the repository root: `python bench/x.py ARGS`."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT).as_posix() if script.is_relative_to(ROOT) else argv[0]
    return shlex.join(["python", shown, *argv[1:]])


def add_results_arg(ap: argparse.ArgumentParser) -> None:
    """`--results DIR`: where the result JSON goes (default `$TINKRL_BENCH_RESULTS` or bench/results)."""
    ap.add_argument(
        "--results",
        type=Path,
        default=Path(os.environ.get(RESULTS_ENV) or RESULTS_DIR),
        help=f"directory for the result JSON (default ${RESULTS_ENV} or bench/results)",
    )


def median_ms(fn: Callable[[], object], repeats: int, warmups: int = 1) -> float:
    """The median wall time of `repeats` calls of `fn`, in ms, after `warmups` calls."""
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def medians(repeats: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The median of each metric's repeats."""
    return {k: statistics.median(v) for k, v in repeats.items()}


def result_path(bench: str, results_dir: Path, info: Mapping | None = None, device: str | None = None) -> Path:
    """Where `write_result` records `bench`'s runs on this machine (`info`, default `machine()`):
    `<results_dir>/<bench>/<machine class>.json`. `device` as in `write_result`."""
    info = info or machine()
    return Path(results_dir) / bench / f"{machine_class(info, device or ('cuda' if info['gpu'] else 'cpu'))}.json"


def write_result(
    bench: str,
    workload: str,
    settings: Mapping,
    repeats: Mapping[str, Sequence[float]],
    results_dir: Path,
    device: str | None = None,
    command: str | None = None,
    commit: str | None = None,
) -> Path:
    """Record one workload's run in `<results_dir>/<bench>/<machine class>.json` (replacing an
    earlier record of the same workload there) and return the file's path. `repeats` maps each
    metric to its raw values, one per repeat; a single measurement is a list of one. `device` is
    where the measured work ran; None means the engine's default, a GPU when there is one. `commit`: what made
    the runs when it is not the checkout (repeats made at several commits)."""
    if not repeats or any(not v for v in repeats.values()):
        raise ValueError(f"{bench}: every metric needs at least one repeat")
    kept = {k: [float(f"{x:.6g}") for x in v] for k, v in repeats.items()}  # 6 significant digits
    info = machine()
    path = result_path(bench, results_dir, info, device)
    doc = json.loads(path.read_text()) if path.is_file() else {"bench": bench, "machine_class": path.stem, "runs": {}}
    doc["runs"][workload] = {
        "command": command or command_line(),
        "commit": commit or COMMIT_AT_START,
        "date": datetime.date.today().isoformat(),
        "machine": info,
        "settings": dict(settings),
        "repeats": kept,
        "median": medians(kept),
    }
    doc["runs"] = dict(sorted(doc["runs"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    # one line per list of numbers: a re-run's diff then shows one line per metric
    text = re.sub(
        r"\[\s*([-0-9.e,\s]*?)\s*\]", lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", json.dumps(doc, indent=1)
    )
    path.write_text(text + "\n")
    print(f"wrote {path} ({workload}); `python bench/report.py` puts it into docs/performance.md", flush=True)
    return path

"""docs/performance.md is a reference: each machine class's current figures first, then one
section per benchmark with its command and its generated table; its tables and runs.md's are
what bench/report.py makes of bench/results/, and the report refuses result files that
bench/common.py would not have written. Measured figures stay out of config comments."""

import argparse
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinkrl.local.compute_plan import vendor_of

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import common  # noqa: E402
import make_train  # noqa: E402
import report  # noqa: E402
import vs_vllm  # noqa: E402

ENGINE = next(t for t in report.TABLES if t.bench == "engine")
ENGINE_DOC = "# doc\n\nprose kept\n\n<!-- generated: engine -->\nstale\n<!-- /generated -->\n\nmore prose\n"
PERFORMANCE = ROOT / "docs" / "performance.md"
RUNS = ROOT / "docs" / "runs.md"


def engine_result(**changes) -> dict:
    """A result file as bench/common.py writes it: one engine run on a made-up 4-core AVX2 CPU."""
    repeats = {
        "sampling/tinkrl_concurrent_tok_s": [1400.0, 1500.0, 1600.0],
        "sampling/tinkrl_prebatched_tok_s": [1450.0, 1550.0, 1650.0],
        "sampling/tinkrl_lora_concurrent_tok_s": [1000.0, 1100.0, 1200.0],
        "sampling/hf_generate_tok_s": [500.0, 490.0, 510.0],
    }
    run = {
        "command": "python bench/engine.py --precision float32",
        "commit": "abc1234",
        "date": "2026-11-24",
        "machine": {
            "cpu_model": "Test CPU",
            "cpu_vendor": "amd",
            "cpu_class": "avx2",
            "cores": 4,
            "threads": 4,
            "ram_gib": 16.0,
            "gpu": None,
            "torch": "2.13.0",
        },
        "settings": {"model": "SmolLM2", "precision": "float32"},
        "repeats": repeats,
        "median": common.medians(repeats),
    }
    run.update(changes)
    return {"bench": "engine", "machine_class": "cpu-amd-avx2-4c", "runs": {"SmolLM2 float32": run}}


def write(results: Path, doc: dict) -> Path:
    path = results / "engine" / "cpu-amd-avx2-4c.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_doc_matches_the_committed_results():
    out = subprocess.run(
        [sys.executable, "bench/report.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_renders_a_result_into_its_block_and_keeps_the_prose(tmp_path):
    write(tmp_path, engine_result())
    text = report.regenerate(ENGINE_DOC, tmp_path, [ENGINE])
    assert text.startswith("# doc\n\nprose kept\n\n<!-- generated: engine -->\n") and "stale" not in text
    assert text.endswith("<!-- /generated -->\n\nmore prose\n")
    row = "| `cpu-amd-avx2-4c` | SmolLM2 | float32 | 1,500 | 1,550 | 1,100 | 500 | 3.00x | not run | not run | abc1234 | 2026-11-24 |"
    assert row in text.splitlines()
    # the classes the doc tracks but the results lack get a row saying how to measure them
    assert (
        f"| `{report.CPU_REFERENCE}` | not yet measured on this machine class: run `python bench/engine.py` |" in text
    )
    assert "- `cpu-amd-avx2-4c`: Test CPU (avx2), 4 cores, 4 threads, 16 GiB RAM, no GPU, torch 2.13.0" in text
    assert report.regenerate(text, tmp_path, [ENGINE]) == text


def test_no_results_render_not_yet_measured_rows(tmp_path):
    text = report.regenerate(ENGINE_DOC, tmp_path, [ENGINE])
    rows = [line for line in text.splitlines() if "not yet measured on this machine class" in line]
    assert [r.split(" | ")[0] for r in rows] == [f"| `{c}`" for c in ENGINE.machine_classes]


@pytest.mark.parametrize(
    "breaks",
    [
        lambda d: d["runs"]["SmolLM2 float32"]["median"].update({"sampling/hf_generate_tok_s": 999.0}),
        lambda d: d["runs"]["SmolLM2 float32"].update(date="2026-11-24 10:05"),
        lambda d: d["runs"]["SmolLM2 float32"].update(commit="HEAD"),
        lambda d: d["runs"]["SmolLM2 float32"].pop("machine"),
        lambda d: d["runs"]["SmolLM2 float32"]["machine"].pop("cpu_class"),
        lambda d: d["runs"]["SmolLM2 float32"]["repeats"].update({"sampling/hf_generate_tok_s": ["fast"]}),
        lambda d: d["runs"]["SmolLM2 float32"]["repeats"].pop("sampling/tinkrl_concurrent_tok_s"),
        lambda d: d["runs"]["SmolLM2 float32"].update(verdict="target met"),
        lambda d: d.update(bench="sandbox"),
        lambda d: d.update(machine_class="cpu-intel-amx-4c"),
    ],
    ids=[
        "median-not-of-repeats",
        "time-of-day",
        "commit-not-a-hash",
        "no-machine",
        "machine-field-missing",
        "repeat-not-a-number",
        "needed-metric-missing",
        "unknown-field",
        "wrong-bench",
        "class-not-file-name",
    ],
)
def test_a_wrong_field_fails_the_report(tmp_path, breaks):
    doc = copy.deepcopy(engine_result())
    breaks(doc)
    if "sampling/tinkrl_concurrent_tok_s" not in doc["runs"]["SmolLM2 float32"]["repeats"]:
        doc["runs"]["SmolLM2 float32"]["median"].pop("sampling/tinkrl_concurrent_tok_s")
    write(tmp_path, doc)
    with pytest.raises(report.ResultError, match="cpu-amd-avx2-4c.json"):
        report.regenerate(ENGINE_DOC, tmp_path, [ENGINE])
    docs = copy_docs(tmp_path / "docs")
    before = [d.read_text() for d in docs]
    assert report.main(["--results", str(tmp_path), *doc_args(docs)]) == 2
    assert [d.read_text() for d in docs] == before  # nothing written


def copy_docs(where: Path) -> list[Path]:
    """performance.md and runs.md copied into `where`, for the report to rewrite."""
    where.mkdir(parents=True, exist_ok=True)
    out = [where / PERFORMANCE.name, where / RUNS.name]
    for src, dst in zip((PERFORMANCE, RUNS), out):
        dst.write_text(src.read_text())
    return out


def doc_args(docs: list[Path]) -> list[str]:
    return [arg for d in docs for arg in ("--doc", str(d))]


def test_check_fails_on_a_hand_edit_and_the_report_fixes_it(tmp_path):
    docs = copy_docs(tmp_path / "docs")
    perf, runs = docs
    results = tmp_path / "results"
    write(results, engine_result())
    check = ["--check", "--results", str(results), *doc_args(docs)]
    assert report.main(check) == 1
    assert report.main(["--results", str(results), *doc_args(docs)]) == 0
    assert report.main(check) == 0
    assert "| `cpu-amd-avx2-4c` | SmolLM2 | float32 | 1,500 |" in perf.read_text()
    # the record's class now has its headline row in the current figures
    assert (
        "| `cpu-amd-avx2-4c` | engine vs transformers/peft, float32 | sampling 3.00x HF `generate` |"
        in perf.read_text()
    )
    perf.write_text(perf.read_text().replace("| 1,500 |", "| 1,900 |"))
    assert report.main(check) == 1
    perf.write_text(perf.read_text().replace("| 1,900 |", "| 1,500 |"))
    assert report.main(check) == 0
    # a hand edit in the runs page's generated block is caught too
    marker = "<!-- generated: make_train_runs -->\n"
    runs.write_text(runs.read_text().replace(marker, marker + "| a row typed in |\n"))
    assert report.main(check) == 1


def test_every_block_is_in_exactly_one_doc(tmp_path):
    perf, runs = PERFORMANCE.read_text(), RUNS.read_text()
    with pytest.raises(report.ResultError, match=r"missing \['make_train_runs', 'merge_rate', 'trainer_memory'\]"):
        report.regenerate_docs({PERFORMANCE: perf}, report.RESULTS_DIR)
    with pytest.raises(report.ResultError, match="missing"):
        report.regenerate_docs({Path("x.md"): "# no blocks\n"}, tmp_path)
    block = "<!-- generated: engine -->\n<!-- /generated -->\n"
    with pytest.raises(report.ResultError, match="in more than one place"):
        report.regenerate_docs({PERFORMANCE: perf, RUNS: runs + block}, report.RESULTS_DIR)
    with pytest.raises(report.ResultError, match="twice"):
        report.regenerate("# doc\n" + block + block, report.RESULTS_DIR)
    with pytest.raises(report.ResultError, match="unknown"):
        report.regenerate("<!-- generated: no_such_table -->\n<!-- /generated -->\n", report.RESULTS_DIR)
    assert report.main(["--check"]) == 0  # by default both docs, which hold every block between them


def make_train_result(runs: dict[str, tuple[str, str, str, float, float]]) -> dict:
    """bench/make_train.py's records of a made-up class: name -> (sampler, commit, date, steps,
    held-out greedy after)."""
    out = {}
    for name, (sampler, commit_, date, steps, after) in runs.items():
        repeats = {
            "steps": [steps],
            "late_step_s": [3.0],
            "late_sample_s": [2.0],
            "late_train_s": [1.0],
            "wall_s": [550.0],
            "greedy_before": [0.02],
            "greedy_after": [after],
        }
        machine = engine_result()["runs"]["SmolLM2 float32"]["machine"]
        out[name] = {
            "command": "python bench/make_train.py runs/arithmetic",
            "commit": commit_,
            "date": date,
            "machine": machine,
            "settings": {"model_name": "SmolLM2", "batch_size": 64, "sampler_precision": sampler},
            "repeats": repeats,
            "median": common.medians(repeats),
        }
    return {"bench": "make_train", "machine_class": "cpu-amd-avx2-4c", "runs": out}


def test_make_train_runs_are_summarised_per_class_and_sampler(tmp_path):
    runs = {
        "a": ("bfloat16", "aaaaaaa", "2026-12-01", 100, 0.80),
        "b": ("bfloat16", "bbbbbbb", "2026-12-03", 140, 0.90),
        "c": ("bfloat16", "ccccccc", "2026-12-02", 120, 0.84),
        "d": ("matched", "ddddddd", "2026-12-03", 90, 0.86),
    }
    path = tmp_path / "make_train" / "cpu-amd-avx2-4c.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(make_train_result(runs)))
    summary = next(t for t in report.TABLES if t.block == "make_train")
    rows = summary.markdown(tmp_path).splitlines()
    assert (
        "| `cpu-amd-avx2-4c` | SmolLM2 | bfloat16 | as found | 3 | 120 (100-140) | 3.00 (3.00-3.00) | 0.84 (0.80-0.90) | no eval"
        " | 9m10s | bbbbbbb | 2026-12-01 to 2026-12-03 |" in rows
    )
    assert (
        "| `cpu-amd-avx2-4c` | SmolLM2 | matched | as found | 1 | 90 | 3.00 | 0.86 | no eval | 9m10s | ddddddd | 2026-12-03 |"
        in rows
    )
    every_run = next(t for t in report.TABLES if t.block == "make_train_runs").markdown(tmp_path)
    assert sum(line.startswith("| `cpu-amd-avx2-4c`") for line in every_run.splitlines()) == 4
    current = report.current_block(tmp_path).splitlines()
    assert (
        "| `cpu-amd-avx2-4c` | `make train`, bfloat16 sampler (median of 3 runs) | 120 steps in the budget,"
        " held-out greedy 0.02 -> 0.84, late steps 3.00 s/step | bbbbbbb | 2026-12-01 to 2026-12-03 |" in current
    )
    assert len([line for line in current if line.startswith("| `")]) == 2  # one row per sampler
    # runs of another model are never pooled with the default model's
    doc = make_train_result(runs)
    doc["runs"]["c"]["settings"]["model_name"] = "OtherLM"
    path.write_text(json.dumps(doc))
    rows = summary.markdown(tmp_path).splitlines()
    assert (
        "| `cpu-amd-avx2-4c` | OtherLM | bfloat16 | as found | 1 | 120 | 3.00 | 0.84 | no eval | 9m10s | ccccccc | 2026-12-02 |"
        in rows
    )
    assert any(
        line.startswith("| `cpu-amd-avx2-4c` | SmolLM2 | bfloat16 | as found | 2 | 120 (100-140) |") for line in rows
    )
    assert any(
        "| `make train`, OtherLM, bfloat16 sampler (1 run) |" in line
        for line in report.current_block(tmp_path).splitlines()
    )
    # a new user's runs (fresh clone, caches empty) are never pooled with runs on a machine as found
    doc["runs"]["c"]["settings"]["model_name"] = "SmolLM2"
    doc["runs"]["b"]["settings"]["start"] = "fresh clone"
    path.write_text(json.dumps(doc))
    rows = summary.markdown(tmp_path).splitlines()
    assert any(line.startswith("| `cpu-amd-avx2-4c` | SmolLM2 | bfloat16 | fresh clone | 1 | 140 |") for line in rows)
    assert any(
        line.startswith("| `cpu-amd-avx2-4c` | SmolLM2 | bfloat16 | as found | 2 | 110 (100-120) |") for line in rows
    )
    assert any(
        "| `make train`, bfloat16 sampler, fresh clone (1 run) |" in line
        for line in report.current_block(tmp_path).splitlines()
    )


# --- the doc as a reference ----------------------------------------------------------------


def sections(text: str) -> dict[str, str]:
    """performance.md's `## ` sections: heading -> body."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_performance_doc_is_a_short_reference_with_the_current_figures_first():
    text = PERFORMANCE.read_text()
    blocks = [m.group("name") for m in report.BLOCK.finditer(text)]
    first_section = text.index("\n## ")
    assert blocks[0] == "current" and text.index("<!-- generated: current -->") < text.index("\n## ", first_section + 1)
    # every headline benchmark with results has its classes in the current figures
    current = next(m.group("body") for m in report.BLOCK.finditer(text) if m.group("name") == "current")
    for bench in report.HEADLINE_BENCHES:
        for result in (report.RESULTS_DIR / bench).glob("*.json"):
            assert f"| `{result.stem}` |" in current, (bench, result.stem)
    assert "runs.md" in text  # where the per-run figures went


def test_every_benchmark_has_a_section_with_its_command():
    text = PERFORMANCE.read_text()
    command = re.compile(r"`(?:python bench/\w+\.py|bash bench/\w+\.sh|make [\w-]+)")
    for heading, body in sections(text).items():
        if heading != "Current figures by machine class":
            assert command.search(body), f"section {heading!r} names no command"
    scripts = [p for p in sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "bench").glob("*.sh"))]
    for script in scripts:
        if script.name not in ("common.py", "report.py"):
            assert f"bench/{script.name}" in text, f"bench/{script.name} has no place in docs/performance.md"
    # every benchmark table is rendered into one of the docs (report.py checks exactly one)
    blocks = {m.group("name") for doc in (PERFORMANCE, RUNS) for m in report.BLOCK.finditer(doc.read_text())}
    assert {b.block for b in report.BLOCKS} <= blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_references_to_its_sections_resolve():
    """The docs, configs and code point into performance.md by section title ("Decode step") or
    anchor (#make-train-agent): each must name a section it has."""
    headings = list(sections(PERFORMANCE.read_text()))
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "configs").glob("*.yaml")]
    files += [*(ROOT / "bench").glob("*.py"), *(ROOT / "tinkrl").rglob("*.py"), *(ROOT / "tinkrl").rglob("*.c")]
    found = 0
    for path in files:
        text = re.sub(r"\s+", " ", path.read_text())
        for m in re.finditer(r"performance\.md\)?,? (?:\"([^\"]+)\"|(`[^`]+`))", text):
            title = m.group(1) or m.group(2)
            assert any(h.startswith(title) for h in headings), f"{path.name} points at {title!r}"
            found += 1
        for m in re.finditer(r"performance\.md#([\w-]+)", text):
            assert m.group(1) in map(slug, headings), f"{path.name} links #{m.group(1)}"
            found += 1
    assert found >= 10


FIGURE = re.compile(
    r"~\s*\d|\d+(?:\.\d+)?\s*(?:%|(?:ms|s|x|GB|MB|GiB|MiB|tok/s)\b)|\d+(?:\.\d+)?-\d+(?:\.\d+)?\s*(?:steps|tokens)\b"
)


def test_config_comments_hold_no_measured_figures():
    """A setting's comment says what it does and why; what it measured is in bench/results and
    docs/performance.md (a measured figure in a comment goes stale with the next kernel change)."""
    files = [*(ROOT / "configs").glob("*.yaml"), *(ROOT / "deploy").rglob("*.yaml")]
    assert len(files) >= 5
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            comment = line.split("#", 1)[1] if "#" in line else ""
            assert not FIGURE.search(comment), f"{path.relative_to(ROOT)}:{n}: {comment.strip()}"
    assert FIGURE.search(" torch.compile: ~1.5x faster steps after ~40 s of compiling")
    assert FIGURE.search(" ~150-200 steps on a 2-core CPU") and FIGURE.search(" about 30% slower")


def test_write_result_keeps_one_record_per_workload(tmp_path):
    first = common.write_result("sandbox", "bwrap cold", {"runs": 2}, {"sequential_s": [0.02, 0.01]}, tmp_path, "cpu")
    again = common.write_result(
        "sandbox", "bwrap cold", {"runs": 3}, {"sequential_s": [0.03, 0.01, 0.02]}, tmp_path, "cpu"
    )
    common.write_result("sandbox", "bwrap pool=2", {"runs": 1}, {"sequential_s": [0.005]}, tmp_path, "cpu")
    assert first == again and first.parent == tmp_path / "sandbox"
    records = report.read_records(first, "sandbox")
    assert [r.workload for r in records] == ["bwrap cold", "bwrap pool=2"]
    cold = records[0]
    assert cold.repeats == {"sequential_s": [0.03, 0.01, 0.02]} and cold.median == {"sequential_s": 0.02}
    assert cold.command.startswith("python ") and cold.date.count("-") == 2
    assert cold.commit == "unknown" or len(cold.commit.removesuffix("-dirty")) >= 7


def test_vs_vllm_refuses_a_run_that_would_drop_recorded_workloads(tmp_path):
    workloads = {"a": {"prompts": 32, "samples": 1, "tokens": 16}, "b": {"prompts": 8, "samples": 8, "tokens": 64}}
    common.write_result("vs_vllm", "tinkrl float32", {"workloads": workloads}, {"startup_s": [3.0]}, tmp_path, "cpu")

    def run(sides: list[str], chosen: list[str], results: Path = tmp_path) -> argparse.Namespace:
        return argparse.Namespace(
            results=results, sides=sides, tinkrl_precision=["float32"], vllm_dtype=["bfloat16"], workloads=chosen
        )

    with pytest.raises(SystemExit, match="workloads b, which this run leaves out"):
        vs_vllm.refuse_partial_records(run(["tinkrl"], ["a", "e"]))
    vs_vllm.refuse_partial_records(run(["tinkrl"], ["a", "b", "e"]))  # keeps every recorded workload
    vs_vllm.refuse_partial_records(run(["vllm"], ["e"]))  # no vLLM record to lose
    vs_vllm.refuse_partial_records(run(["tinkrl"], ["e"], tmp_path / "apart"))  # results kept elsewhere


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"avx2", "avx512_bf16", "amx_tile"}, "amx"),
        ({"avx2", "avx512_bf16"}, "avx512_bf16"),
        ({"avx2"}, "avx2"),
        (set(), "other"),
    ],
)
def test_cpu_class_from_flags(flags, expected):
    assert common.cpu_class(flags) == expected


def test_machine_class_names_the_gpu_only_for_gpu_work():
    info = {"cpu_vendor": "amd", "cpu_class": "avx512_bf16", "cores": 2, "gpu": "NVIDIA H100 80GB HBM3"}
    assert common.machine_class(info, "cuda") == report.GPU_REFERENCE
    assert common.machine_class(info, "cpu") == report.CPU_REFERENCE


def test_one_instruction_class_on_two_vendors_is_two_machine_classes():
    """An AMD EPYC and an Intel Xeon without AMX share AVX512-BF16 but not its speed: their
    records go to different files."""
    assert vendor_of("AuthenticAMD") == "amd"
    assert vendor_of("GenuineIntel\n") == "intel"
    assert vendor_of("CentaurHauls") == "other"
    amd = {"cpu_vendor": "amd", "cpu_class": "avx512_bf16", "cores": 2, "gpu": None}
    intel = {**amd, "cpu_vendor": "intel"}
    assert common.machine_class(amd) == "cpu-amd-avx512_bf16-2c"
    assert common.machine_class(intel) == "cpu-intel-avx512_bf16-2c"
    assert common.result_path("vs_vllm", Path("r"), amd) != common.result_path("vs_vllm", Path("r"), intel)
    assert common.machine()["cpu_vendor"] in {"amd", "intel", "other"}


def test_make_train_figures_leave_out_the_last_step():
    rows = [
        {"time/step": 10.0 + i, "time/sample": 1.0, "time/train": 2.0, "time/total": 30.0 * (i + 1)} for i in range(6)
    ]
    rows[0]["eval/arithmetic/greedy_correct"] = 0.02
    rows[-1] |= {"eval/arithmetic/greedy_correct": 0.89, "eval/arithmetic/sampled_correct": 0.86}
    figures = make_train.run_figures(rows)
    assert figures["late_step_s"] == [13.0, 14.0]
    assert figures["steps"] == [6] and figures["wall_s"] == [180.0]
    assert (figures["greedy_before"], figures["greedy_after"], figures["sampled_after"]) == ([0.02], [0.89], [0.86])

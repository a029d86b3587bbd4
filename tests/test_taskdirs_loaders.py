"""Loaders for every format, and errors that name the file and the field or line."""

import json
import shutil
from pathlib import Path

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.taskdirs import TaskLoadError, iter_tasks, load_task
from tinkrl.taskdirs.dockerfile import build_dockerfile

TASKS = Path(__file__).resolve().parents[1] / "tasks"


def test_fixture_tasks_load_in_every_format_and_grader():
    items = list(iter_tasks([TASKS]))
    errors = [i for i in items if isinstance(i, TaskLoadError)]
    assert not errors, errors
    assert len(items) >= 12
    assert {t.format for t in items} == {"harbor", "terminal-bench", "r2e", "swebench"}
    assert {t.grader for t in items} == {"reward_file", "pytest", "r2e", "swebench"}
    assert all(t.instruction and t.has_solution and t.content_hash for t in items)


def test_harbor_dockerfile_build_steps():
    t = load_task(TASKS / "fix-permissions")
    assert t.workdir == "/app" and t.env == {"DATA_LABEL": "processed"}
    kinds = [(s.kind, s.origin.rsplit(":", 1)[-1]) for s in t.build]
    assert kinds == [("copy", "4"), ("copy", "5"), ("run", "6")]
    assert t.build[1].copy.dest == "/app/data.txt"


def test_harbor_package_names_keep_the_short_task_id(tmp_path):
    """Harbor names tasks `org/name` ([task] name); the task's id is `name`, the full name kept in metadata."""
    t = load_task(TASKS / "hello-file")
    assert t.id == "hello-file" and t.metadata["harbor_name"] == "tinkrl/hello-file"
    d = tmp_path / "plain"
    shutil.copytree(TASKS / "hello-file", d)
    (d / "task.toml").write_text((d / "task.toml").read_text().replace('"tinkrl/hello-file"', '"plain-name"'))
    plain = load_task(d)
    assert plain.id == "plain-name" and "harbor_name" not in plain.metadata


def test_terminal_bench_task():
    t = load_task(TASKS / "tb-large-files")
    assert t.grader == "pytest" and t.verifier_env == {"TEST_DIR": "/tests"}
    assert t.verifier_timeout_s == 60.0 and t.test_command == "bash /tests/run-tests.sh"
    # the apt-get line only installs python3, which is present: skipped, not run
    assert [s.kind for s in t.build] == ["run"] and "head -c" in t.build[0].command


def test_rows_load_with_expected_results():
    swe = [t for t in iter_tasks([TASKS / "swebench_rows.jsonl"])]
    assert [t.id for t in swe] == ["calc__calc-1", "calc__calc-2"]
    assert swe[0].expected["FAIL_TO_PASS"] == ["tests/test_ops.py::test_divide_by_zero"]
    assert swe[0].workdir == "/testbed"
    (r2e,) = iter_tasks([TASKS / "r2e_rows.json"])
    assert r2e.expected["tests"]["TestUnicode.test_accents_dropped"] == "PASSED"
    assert not r2e.instruction.startswith("[ISSUE]")


def copy_task(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(TASKS / name, dst)
    return dst


def test_harbor_errors_name_file_and_field(tmp_path):
    d = copy_task(tmp_path, "hello-file")
    (d / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n')
    with pytest.raises(TaskLoadError) as e:
        load_task(d)
    assert "task.toml" in str(e.value) and "[verifier] timeout_sec" in str(e.value)
    (d / "task.toml").write_text("[task]\n")
    (d / "instruction.md").unlink()
    with pytest.raises(TaskLoadError, match="instruction.md: missing"):
        load_task(d)


def test_dockerfile_errors_name_the_line(tmp_path):
    df = tmp_path / "Dockerfile"
    df.write_text("FROM namanjain12/sympy_final:abc\n")
    with pytest.raises(TaskLoadError, match=r"Dockerfile:1: FROM namanjain12"):
        build_dockerfile(df, tmp_path)
    df.write_text("FROM ubuntu:24.04\n# comment\nRUN apt-get update && \\\n    apt-get install -y tinkrl-no-such-pkg\n")
    with pytest.raises(TaskLoadError, match=r"Dockerfile:3: .*tinkrl-no-such-pkg"):
        build_dockerfile(df, tmp_path)
    df.write_text("FROM python:3.11\nWORKDIR /app\nRUN curl -sSL https://example.com/x | sh\n")
    with pytest.raises(TaskLoadError, match=r"Dockerfile:3: .*network"):
        build_dockerfile(df, tmp_path)
    df.write_text("FROM python:3.11\nCOPY missing.txt /app/\n")
    with pytest.raises(TaskLoadError, match=r"Dockerfile:2: .*missing.txt"):
        build_dockerfile(df, tmp_path)
    df.write_text("FROM python:3.11\nCOPY Dockerfile /usr/local/bin/\n")
    with pytest.raises(TaskLoadError, match=r"Dockerfile:2: .*read-only"):
        build_dockerfile(df, tmp_path)


def test_workspace_and_setup_override_an_unbuildable_dockerfile(tmp_path):
    d = copy_task(tmp_path, "tb-backup-script")
    (d / "Dockerfile").write_text("FROM some/private-image:1\n")
    assert load_task(d).build[0].kind == "copy"


def test_bad_rows_are_reported_and_the_rest_still_load(tmp_path):
    rows = tmp_path / "rows.jsonl"
    good = json.loads((TASKS / "swebench_rows.jsonl").read_text().splitlines()[0])
    good["workspace"] = str(TASKS / "_repos" / "calc")
    neither = {k: v for k, v in good.items() if k != "workspace"}
    rows.write_text(
        "\n".join([json.dumps(neither), "{not json", json.dumps(good), json.dumps({**good, "FAIL_TO_PASS": "[]"})])
        + "\n"
    )
    items = list(iter_tasks([rows]))
    assert [type(i).__name__ for i in items] == ["TaskLoadError", "TaskLoadError", "Task", "TaskLoadError"]
    assert items[0].field == "workspace" and "docker_image" in str(items[0]) and "rows.jsonl:1" in str(items[0])
    assert "rows.jsonl:2" in str(items[1])
    assert items[3].field == "FAIL_TO_PASS"


def test_rows_with_only_an_image_load_and_carry_it(tmp_path):
    swe = json.loads((TASKS / "swebench_rows.jsonl").read_text().splitlines()[0])
    r2e = json.loads((TASKS / "r2e_rows.json").read_text())[0]
    image_only = [
        {k: v for k, v in swe.items() if k != "workspace"} | {"docker_image": "swebench/sweb.eval.x:1"},
        {k: v for k, v in r2e.items() if k not in ("workspace", "tests", "docker_image")} | {"image_name": "r2e/y:2"},
        {**swe, "workspace": str(TASKS / "_repos" / "calc"), "image": "swebench/z:3"},
        {k: v for k, v in swe.items() if k != "workspace"} | {"docker_image": ["not", "a", "name"]},
    ]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in image_only) + "\n")
    swe_img, r2e_img, both, bad = list(iter_tasks([rows]))
    assert swe_img.image == "swebench/sweb.eval.x:1" and swe_img.build == [] and swe_img.original_files == {}
    # the files the test patch touches are reset from the image's own versions before grading
    assert swe_img.restore_paths and all(p.startswith("/testbed/") for p in swe_img.restore_paths)
    assert "miniconda3" in swe_img.test_command and swe_img.pre_test_command.startswith("git apply")
    assert r2e_img.image == "r2e/y:2" and r2e_img.build == [] and r2e_img.tests == []
    assert r2e_img.image_tests == "/testbed/r2e_tests"
    # both: bwrap builds the workspace, docker/kubernetes start the image
    assert both.image == "swebench/z:3" and [s.kind for s in both.build] == ["copy", "run"]
    assert isinstance(bad, TaskLoadError) and bad.field == "docker_image"


def test_harbor_docker_image_is_carried(tmp_path):
    d = copy_task(tmp_path, "fix-pagination")
    toml = (d / "task.toml").read_text()
    (d / "task.toml").write_text(toml.replace("[environment]", '[environment]\ndocker_image = "ghcr.io/acme/hello:1"'))
    both = load_task(d)
    assert both.image == "ghcr.io/acme/hello:1" and both.build  # its workspace still serves bwrap
    shutil.rmtree(d / "environment")
    (d / "environment").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM ghcr.io/acme/private-base:1\n")
    only = load_task(d)  # an unconvertible Dockerfile is fine: the image replaces it
    assert only.image == "ghcr.io/acme/hello:1" and only.build == []
    assert "private-base" in only.metadata["tinkrl_build_error"]


@needs_bwrap
def test_an_image_only_task_is_refused_on_bwrap_with_the_fix(tmp_path):
    from tinkrl.errors import ConfigError
    from tinkrl.sandbox import get_provider
    from tinkrl.taskdirs import run_gate, start_sandbox
    from tinkrl.taskdirs.verifier import sandbox_spec

    swe = json.loads((TASKS / "swebench_rows.jsonl").read_text().splitlines()[0])
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({k: v for k, v in swe.items() if k != "workspace"} | {"docker_image": "sweb/x:1"})
        + "\n"
        + json.dumps({**swe, "workspace": str(TASKS / "_repos" / "calc"), "docker_image": "sweb/x:1"})
    )
    image_only, both = list(iter_tasks([rows]))
    provider = get_provider("bwrap")
    try:
        with pytest.raises(ConfigError) as e:
            start_sandbox(image_only, provider)
        msg = str(e.value)
        assert image_only.id in msg and "'sweb/x:1'" in msg and "sandbox.provider=docker or kubernetes" in msg
        gate = run_gate(image_only, provider, use_cache=False)  # the gate reports it for this task only
        assert not gate.ok and "sandbox.provider=docker" in gate.detail
        assert sandbox_spec(both, provider).image is None  # bwrap builds the workspace instead
        with start_sandbox(both, provider) as sb:
            assert sb.exec("test -f /testbed/calc/__init__.py -o -f /testbed/conftest.py").exit_code == 0
    finally:
        provider.close()


def test_terminal_bench_missing_instruction(tmp_path):
    d = copy_task(tmp_path, "tb-hello")
    (d / "task.yaml").write_text("difficulty: easy\n")
    with pytest.raises(TaskLoadError) as e:
        load_task(d)
    assert e.value.field == "instruction" and "task.yaml" in e.value.where

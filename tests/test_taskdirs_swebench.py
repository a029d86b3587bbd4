"""SWE-bench rows graded through the official swebench package: the per-repo test command, log parser and
grading for a pytest repo, django's runtests.py and sympy's bin/test, and predictions.jsonl read back by
swebench's own loaders."""

import json
import sys

import pytest

from tinkrl.taskdirs import load_task
from tinkrl.taskdirs.verifier import grade_swebench

pytest.importorskip("swebench", reason="the swebench extra")


def row(repo, version, test_file, f2p, p2p, iid):
    """A SWE-bench row as the dataset ships it (F2P/P2P as JSON strings), run from the instance's image."""
    return {
        "instance_id": iid,
        "repo": repo,
        "version": version,
        "base_commit": "0" * 40,
        "problem_statement": "fix it",
        "patch": "",
        "test_patch": f"diff --git a/{test_file} b/{test_file}\n--- a/{test_file}\n+++ b/{test_file}\n@@ -1 +1,2 @@\n x\n+y\n",
        "FAIL_TO_PASS": json.dumps(f2p),
        "PASS_TO_PASS": json.dumps(p2p),
        "docker_image": f"swebench/sweb.eval.x86_64.{iid.replace('__', '_1776_')}:latest",
    }


# -- a pytest repo -------------------------------------------------------------------------------
PYTEST_ROW = row(
    "pytest-dev/pytest",
    "5.4",
    "testing/test_skipping.py",
    ["testing/test_skipping.py::test_relpath_rootdir"],
    [
        "testing/test_skipping.py::TestEvaluator::test_no_marker",
        "testing/test_skipping.py::test_skip_not_report_default",
    ],
    "pytest-dev__pytest-7432",
)


def pytest_log(fix: str, p2p: str = "PASSED") -> str:
    return f"""============================= test session starts ==============================
platform linux -- Python 3.9.20, pytest-5.4.1.dev593+ge6e300e72, py-1.11.0, pluggy-0.13.1
rootdir: /testbed, inifile: tox.ini
collected 3 items

testing/test_skipping.py ..F                                             [100%]

==================================== PASSES ====================================
=========================== short test summary info ============================
{p2p} testing/test_skipping.py::TestEvaluator::test_no_marker
PASSED testing/test_skipping.py::test_skip_not_report_default
{fix} testing/test_skipping.py::test_relpath_rootdir{" - AssertionError: assert 'SKIPPED [1] src/_pytest/skipping.py:239'" if fix == "FAILED" else ""}
========================= 1 failed, 2 passed in 0.31s ==========================
"""


def test_pytest_repo_runs_swebench_command_and_grades_with_its_parser(tmp_path):
    t = load_task_row(PYTEST_ROW, tmp_path)
    assert t.test_command.endswith("; pytest -rA testing/test_skipping.py")
    f2p, p2p, repo = t.expected["FAIL_TO_PASS"], t.expected["PASS_TO_PASS"], t.expected["repo"]
    assert repo == "pytest-dev/pytest"
    assert grade_swebench(pytest_log("PASSED"), f2p, p2p, repo).reward == 1.0
    r = grade_swebench(pytest_log("FAILED"), f2p, p2p, repo)
    assert r.reward == 0.0 and "FAIL_TO_PASS 0/1" in r.detail and "RESOLVED_NO" in r.detail
    broke = grade_swebench(pytest_log("PASSED", p2p="ERROR"), f2p, p2p, repo)
    assert broke.reward == 0.0 and "PASS_TO_PASS 1/2" in broke.detail
    # a fix that only skips the FAIL_TO_PASS test is no fix (swebench 4.x alone would call it resolved)
    assert grade_swebench(pytest_log("SKIPPED"), f2p, p2p, repo).reward == 0.0


# -- django: ./tests/runtests.py --------------------------------------------------------------------
DJANGO_ROW = row(
    "django/django",
    "3.0",
    "tests/migrations/test_writer.py",
    ["test_serialize_enums (migrations.test_writer.WriterTests)"],
    [
        "test_args_signature (migrations.test_writer.OperationWriterTests)",
        "test_serialize_builtin_types (migrations.test_writer.WriterTests)",
    ],
    "django__django-11815",
)


def django_log(fixed: bool) -> str:
    enums = "ok" if fixed else "FAIL"
    failure = (
        ""
        if fixed
        else """
======================================================================
FAIL: test_serialize_enums (migrations.test_writer.WriterTests)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/migrations/test_writer.py", line 276, in test_serialize_enums
    ("migrations.test_writer.TextEnum['A']", {'import migrations.test_writer'})
AssertionError: Tuples differ: ("migrations.test_writer.TextEnum('a-value')", {...}) != ...
"""
    )
    return f"""Testing against Django installed in '/testbed/django'
Importing application migrations
Skipping setup of unused database(s): other.
Operations to perform:
  Synchronize unmigrated apps: auth, contenttypes, messages, migrations, sessions, staticfiles
  Apply all migrations: admin, sites
System check identified no issues (0 silenced).
test_args_signature (migrations.test_writer.OperationWriterTests) ... ok
test_serialize_builtin_types (migrations.test_writer.WriterTests) ... ok
test_serialize_enums (migrations.test_writer.WriterTests) ... {enums}
{failure}
----------------------------------------------------------------------
Ran 3 tests in 0.112s

{"OK" if fixed else "FAILED (failures=1)"}
"""


def test_django_runs_runtests_py_on_the_test_module_and_grades_its_output(tmp_path):
    t = load_task_row(DJANGO_ROW, tmp_path)
    cmd = t.test_command
    assert "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 migrations.test_writer" in cmd
    assert "pytest" not in cmd and "export LANG=en_US.UTF-8" in cmd
    f2p, p2p, repo = t.expected["FAIL_TO_PASS"], t.expected["PASS_TO_PASS"], t.expected["repo"]
    assert grade_swebench(django_log(True), f2p, p2p, repo).reward == 1.0
    r = grade_swebench(django_log(False), f2p, p2p, repo)
    assert r.reward == 0.0 and "test_serialize_enums (migrations.test_writer.WriterTests): FAILED" in r.detail
    # the same passing log read as pytest output (the old grading) finds no tests: django needs its own parser
    assert grade_swebench(django_log(True), f2p, p2p, "").reward == 0.0


# -- sympy: bin/test ------------------------------------------------------------------------------
SYMPY_ROW = row(
    "sympy/sympy",
    "1.1",
    "sympy/printing/tests/test_latex.py",
    ["test_latex_indexed"],
    ["test_printmethod", "test_latex_basic"],
    "sympy__sympy-12481",
)


def sympy_log(fixed: bool) -> str:
    indexed = "ok" if fixed else "F"
    trailer = (
        "============= tests finished: 4 passed, in 0.84 seconds =============="
        if fixed
        else """________________________________________________________________________________
______________ sympy/printing/tests/test_latex.py:test_latex_indexed ______________
  File "/testbed/sympy/printing/tests/test_latex.py", line 509, in test_latex_indexed
    assert symbol_latex.split() == indexed_latex.split()
AssertionError

======== tests finished: 3 passed, 1 failed, in 0.84 seconds =========
DO *NOT* COMMIT!"""
    )
    return f"""============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]
architecture:       64-bit
cache:              no
ground types:       python
numpy:              None
random seed:        80522437
hash randomization: on (PYTHONHASHSEED=2873591264)

sympy/printing/tests/test_latex.py[4]
test_printmethod ok
test_latex_basic ok
test_latex_indexed {indexed}
test_latex_UnevaluatedExpr ok                                           [{"OK" if fixed else "FAIL"}]

{trailer}
"""


def test_sympy_runs_bin_test_on_the_file_and_grades_its_output(tmp_path):
    t = load_task_row(SYMPY_ROW, tmp_path)
    assert "bin/test -C --verbose sympy/printing/tests/test_latex.py" in t.test_command
    f2p, p2p, repo = t.expected["FAIL_TO_PASS"], t.expected["PASS_TO_PASS"], t.expected["repo"]
    ok = grade_swebench(sympy_log(True), f2p, p2p, repo)
    assert ok.reward == 1.0 and ok.tests["test_latex_indexed"] == "PASSED"
    r = grade_swebench(sympy_log(False), f2p, p2p, repo)
    assert r.reward == 0.0 and r.tests["test_latex_indexed"] == "FAILED" and "FAIL_TO_PASS 0/1" in r.detail
    assert grade_swebench(sympy_log(True), f2p, p2p, "").reward == 0.0  # not pytest output


def test_row_of_a_repo_swebench_has_no_spec_for_runs_pytest_on_its_test_files(tmp_path):
    r = {**PYTEST_ROW, "repo": "acme/calc", "version": "0.1"}
    t = load_task_row(r, tmp_path)
    assert "pytest -p no:cacheprovider -rA testing/test_skipping.py" in t.test_command
    assert grade_swebench(pytest_log("PASSED"), t.expected["FAIL_TO_PASS"], t.expected["PASS_TO_PASS"], "acme/calc")


def test_predictions_jsonl_is_read_by_swebench_own_loaders(tmp_path):
    """The predictions file `tinkrl eval` writes goes through run_evaluation's reading of predictions and
    its matching against a (local) dataset, which rejects unknown instance ids."""
    from swebench.harness.run_evaluation import get_dataset_from_preds
    from swebench.harness.utils import get_predictions_from_file

    from tinkrl.agents.evaluation import Trial, write_outputs

    rows = [PYTEST_ROW, DJANGO_ROW, SYMPY_ROW]
    dataset = tmp_path / "dataset.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    trials = [
        Trial(PYTEST_ROW["instance_id"], "swebench", 1, reward=0.0, patch="diff --git a/x.py b/x.py\n"),
        Trial(SYMPY_ROW["instance_id"], "swebench", 1, reward=0.0, patch=None),  # the agent changed nothing
    ]
    write_outputs(out, trials, [], {}, "", {"model": "org/model"})
    preds = get_predictions_from_file(str(out / "predictions.jsonl"), str(dataset), "test")
    assert [p["instance_id"] for p in preds] == [PYTEST_ROW["instance_id"], SYMPY_ROW["instance_id"]]
    by_id = {p["instance_id"]: p for p in preds}
    chosen = get_dataset_from_preds(str(dataset), "test", [], by_id, "run", rewrite_reports=False)
    # swebench keeps the instances with a non-empty model_patch
    assert [i["instance_id"] for i in chosen] == [PYTEST_ROW["instance_id"]]
    bad = {**by_id, "nobody__nothing-1": {**preds[0], "instance_id": "nobody__nothing-1"}}
    with pytest.raises(ValueError, match="not found in dataset"):
        get_dataset_from_preds(str(dataset), "test", [], bad, "run", rewrite_reports=False)


def load_task_row(r: dict, tmp_path):
    """Load one row through the rows loader (a .jsonl file of one line)."""
    f = tmp_path / f"{r['instance_id']}.jsonl"
    f.write_text(json.dumps(r) + "\n")
    return load_task(f)


def test_without_swebench_loading_and_grading_say_how_to_install_it(tmp_path, monkeypatch):
    from tinkrl.taskdirs import TaskLoadError, iter_tasks

    for name in ("swebench", "swebench.harness"):
        monkeypatch.setitem(sys.modules, name, None)  # what an uninstalled package imports as
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(DJANGO_ROW) + "\n")
    [err] = list(iter_tasks([f]))
    assert isinstance(err, TaskLoadError) and "pip install 'tinkrl[swebench]'" in str(err)
    r = grade_swebench(django_log(True), ["a"], [], "django/django")
    assert (
        r.reward == 0.0
        and r.detail == "SWE-bench grading needs the official swebench package: pip install 'tinkrl[swebench]'"
    )

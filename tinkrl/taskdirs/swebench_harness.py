"""SWE-bench grading through the official `swebench` package (the `swebench` extra).

Only the glue is written here. The test command of an instance is swebench's own: the
`test_cmd` (and `eval_commands`) of its repo and version in `MAP_REPO_VERSION_TO_SPECS`,
followed by the test directives swebench derives from the test patch (`get_test_directives`:
test files for pytest, dotted modules for django's `./tests/runtests.py`, files for sympy's
`bin/test`). The test output is read by swebench's parser for the repo (`MAP_REPO_TO_PARSER`)
and judged by its grading (`get_eval_tests_report`, `get_resolution_status`). Rows of repos
swebench has no spec for run `pytest -rA` on the files of their test ids and are read by
swebench's pytest parser.

swebench 4.x is the line that ships the per-repo specs (5.x moved them into the dataset rows),
so the extra pins `swebench>=4.1,<5`. One rule is added on top of its grading: a FAIL_TO_PASS
test must be in the passing list, because swebench 4.x counts a skipped FAIL_TO_PASS test as
neither passing nor failing and would call an instance whose fix only skips the test resolved
(5.x fixed this the same way).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from types import ModuleType

MISSING = "SWE-bench grading needs the official swebench package: pip install 'tinkrl[swebench]'"


class SwebenchMissing(ImportError):
    """The `swebench` package is not installed."""


def _modules() -> dict[str, ModuleType]:
    # Imported on first use: swebench pulls in datasets, docker and modal (about 2 s).
    try:
        from swebench.harness import constants, grading, log_parsers
        from swebench.harness.test_spec import python as test_spec_python
    except ImportError:
        raise SwebenchMissing(MISSING) from None
    return {"constants": constants, "grading": grading, "parsers": log_parsers, "spec": test_spec_python}


def repo_spec(repo: str, version: str) -> dict | None:
    """swebench's install/test spec for a repo at a version, or None when it has none."""
    specs = _modules()["constants"].MAP_REPO_VERSION_TO_SPECS
    return specs.get(repo, {}).get(str(version))


def test_command(row: dict) -> str | None:
    """The command swebench's eval script runs for this row (its `eval_commands`, then `test_cmd` and the
    directives of the test patch), or None when swebench has no spec for the row's repo and version."""
    spec = repo_spec(row.get("repo") or "", row.get("version") or "")
    if spec is None:
        return None
    cmd = spec["test_cmd"]
    cmd = cmd[-1] if isinstance(cmd, list) else cmd
    directives = _modules()["spec"].get_test_directives(row)
    # `;`, not `&&`: an eval command that cannot run in the sandbox (locale-gen without root) must not stop the tests
    return "; ".join([*spec.get("eval_commands", []), " ".join([cmd, *map(shlex.quote, directives)])])


@dataclass
class Verdict:
    """swebench's reading of one test log: the status map, its F2P/P2P report and the resolution."""

    resolved: bool
    status: str  # RESOLVED_FULL / RESOLVED_PARTIAL / RESOLVED_NO
    tests: dict[str, str] = field(default_factory=dict)
    report: dict = field(default_factory=dict)


def grade_log(output: str, f2p: list[str], p2p: list[str], repo: str = "") -> Verdict:
    """Parse a test log with swebench's parser for `repo` (its pytest parser for repos it does not know) and
    grade FAIL_TO_PASS / PASS_TO_PASS with swebench's grading; resolved means RESOLVED_FULL and every
    FAIL_TO_PASS test passing."""
    m = _modules()
    c, g = m["constants"], m["grading"]
    parser = m["parsers"].MAP_REPO_TO_PARSER.get(repo) or m["parsers"].MAP_REPO_TO_PARSER["pytest-dev/pytest"]
    tests = parser(output, None)  # swebench's Python parsers do not read the test spec
    eval_type = c.EvalType.FAIL_ONLY if repo in c.FAIL_ONLY_REPOS else c.EvalType.PASS_AND_FAIL
    report = g.get_eval_tests_report(tests, {c.FAIL_TO_PASS: f2p, c.PASS_TO_PASS: p2p}, eval_type=eval_type)
    status = g.get_resolution_status(report)
    resolved = status == c.ResolvedStatus.FULL.value and len(report[c.FAIL_TO_PASS]["success"]) == len(f2p)
    return Verdict(resolved, status, tests, report)

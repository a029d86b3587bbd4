"""Loaders: Harbor task dirs (canonical), terminal-bench 1.x dirs, R2E-Gym and SWE-bench rows.

Every loader returns a `Task`; anything wrong is a `TaskLoadError` naming the file and the
field or line. Rows (JSON list or JSONL) describe repos that upstream ship as container
images; to run without containers a row names a local `workspace` directory (relative to
the rows file) holding the repo at its base commit, and R2E rows a `tests` directory
(their hidden `r2e_tests`) and a `patch` (the gold diff).

A prebuilt image (Harbor `[environment] docker_image`, a row's `docker_image`/`image`/
`image_name`) is carried as `Task.image`. A task may have both: the container providers
(docker, kubernetes) start it from the image and skip the local build; bwrap builds the
local workspace. A task with only an image loads fine and is refused when run on bwrap.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path

import yaml

from tinkrl.sandbox.build import BuildStep, FileCopy
from tinkrl.taskdirs import swebench_harness
from tinkrl.taskdirs.dockerfile import build_dockerfile
from tinkrl.taskdirs.model import Task, TaskLoadError, hash_paths

# Files that steer test runs; before grading they are reset to the task's originals and any
# new ones are removed, so a planted conftest.py/sitecustomize.py/fake pytest changes nothing.
PROTECTED_NAMES = (
    "conftest.py",
    "pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "sitecustomize.py",
    "usercustomize.py",
    "pytest.py",
    "py.py",
    "_pytest",
    "pluggy",
)
PYTEST = "python3 -m pytest -p no:cacheprovider -rA"
# SWE-bench images keep the repo's python in a conda env named testbed (their harness activates it).
SWEBENCH_IMAGE_ENV = "if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate testbed; fi; "
GIT_BASE_COMMIT = (
    "if [ ! -d .git ]; then git init -q && git add -A && "
    "git -c user.name=tinkrl -c user.email=tinkrl@localhost commit -qm base --no-verify; fi"
)


def _num(value, where: str, field: str, default: float) -> float:
    """A positive number of seconds, megabytes or CPUs, or `default` when the field is not set."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TaskLoadError(where, f"must be a number, got {value!r}", field)
    if not math.isfinite(value) or value <= 0:
        raise TaskLoadError(where, f"must be a positive number, got {value!r}", field)
    return float(value)


def _table(value, where: str, field: str) -> dict:
    """A TOML table of names to values (an `env` section), or {} when the field is not set."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TaskLoadError(where, f"must be a table, got {value!r}", field)
    return value


def _text(path: Path, where: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskLoadError(where, "missing (required)") from None
    except UnicodeDecodeError as e:
        raise TaskLoadError(where, f"is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise TaskLoadError(where, f"cannot read: {e.strerror}") from None


def _workspace_steps(env_dir: Path, workdir: str, rel: str) -> list[BuildStep] | None:
    """environment/workspace/ + setup.sh: the container-free way to prepare a task."""
    ws, setup = env_dir / "workspace", env_dir / "setup.sh"
    if not ws.is_dir() and not setup.is_file():
        return None
    steps = []
    if ws.is_dir():
        steps.append(BuildStep(kind="copy", origin=f"{rel}/workspace", copy=FileCopy(dest=workdir, src=ws)))
    if setup.is_file():
        steps += [
            BuildStep(
                kind="copy",
                origin=f"{rel}/setup.sh",
                copy=FileCopy(dest="/tmp/.tinkrl-setup.sh", src=setup, mode=0o755),
            ),
            BuildStep(
                kind="run",
                origin=f"{rel}/setup.sh",
                workdir=workdir,
                command="bash /tmp/.tinkrl-setup.sh; rc=$?; rm -f /tmp/.tinkrl-setup.sh; exit $rc",
            ),
        ]
    return steps


def _original_protected(steps: list[BuildStep]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for s in steps:
        if s.kind != "copy" or s.copy is None or s.copy.src is None:
            continue
        src = s.copy.src
        if src.is_file():
            if src.name in PROTECTED_NAMES:
                out[s.copy.dest] = src.read_bytes()
            continue
        for p in src.rglob("*"):
            if p.is_file() and (p.name in PROTECTED_NAMES or any(part in PROTECTED_NAMES for part in p.parts)):
                out[f"{s.copy.dest.rstrip('/')}/{p.relative_to(src).as_posix()}"] = p.read_bytes()
    return out


def _dir_copy(src: Path, dest: str) -> list[FileCopy]:
    return [FileCopy(dest=dest, src=src)] if src.is_dir() else []


# -- Harbor ----------------------------------------------------------------------------------
def load_harbor(task_dir: Path) -> Task:
    """A Harbor task directory (task.toml, instruction.md, tests/test.sh, environment/, solution/) as a Task."""
    d = Path(task_dir)
    toml_path = d / "task.toml"
    try:
        cfg = tomllib.loads(_text(toml_path, str(toml_path)))
    except tomllib.TOMLDecodeError as e:
        raise TaskLoadError(toml_path, f"invalid TOML: {e}") from None
    for section in ("task", "metadata", "agent", "verifier", "environment", "solution"):
        if section in cfg and not isinstance(cfg[section], dict):
            raise TaskLoadError(toml_path, "must be a table", f"[{section}]")
    agent, verifier, envcfg, meta = (cfg.get(k, {}) for k in ("agent", "verifier", "environment", "metadata"))
    instruction = _text(d / "instruction.md", str(d / "instruction.md")).strip()
    if not instruction:
        raise TaskLoadError(d / "instruction.md", "is empty")
    if not (d / "tests" / "test.sh").is_file():
        raise TaskLoadError(d / "tests" / "test.sh", "missing (required: it writes /logs/verifier/reward.txt|json)")
    env_dir = d / "environment"
    workdir = envcfg.get("workdir")
    if workdir is not None and not (isinstance(workdir, str) and workdir.startswith("/")):
        raise TaskLoadError(toml_path, f"must be an absolute path, got {workdir!r}", "[environment] workdir")
    image = _image_name(envcfg.get("docker_image"), toml_path, "[environment] docker_image")
    steps = _workspace_steps(env_dir, workdir or "/app", "environment")
    env: dict[str, str] = {}
    meta = dict(meta)
    definition = None
    if steps is None and (env_dir / "Dockerfile").is_file():
        try:
            build = build_dockerfile(env_dir / "Dockerfile", env_dir, str(env_dir / "Dockerfile"))
        except TaskLoadError as e:
            if not image:
                raise
            # the image stands in for a Dockerfile bwrap cannot build; say why if bwrap is asked
            meta["tinkrl_build_error"] = str(e)
        else:
            workdir = workdir or (build.workdir if build.workdir != "/" else None)
            steps, env, definition = build.steps, dict(build.env), env_dir
    workdir = workdir or "/app"
    env.update({str(k): str(v) for k, v in _table(envcfg.get("env"), str(toml_path), "[environment] env").items()})
    grader = meta.get("tinkrl_grader", "reward_file")
    if grader not in ("reward_file", "pytest"):
        raise TaskLoadError(toml_path, f"must be reward_file or pytest, got {grader!r}", "[metadata] tinkrl_grader")
    solve = d / "solution" / "solve.sh"
    where = str(toml_path)
    name = (cfg.get("task") or {}).get("name")
    if isinstance(name, str) and "/" in name:  # Harbor's package name, org/name: the task is `name`
        meta["harbor_name"] = name
        name = name.rsplit("/", 1)[1]
    return Task(
        id=name or d.name,
        source=d,
        format="harbor",
        instruction=instruction,
        workdir=workdir,
        grader=grader,
        env=env,
        agent_timeout_s=_num(agent.get("timeout_sec"), where, "[agent] timeout_sec", 600.0),
        verifier_timeout_s=_num(verifier.get("timeout_sec"), where, "[verifier] timeout_sec", 600.0),
        memory_mb=math.ceil(_num(envcfg.get("memory_mb"), where, "[environment] memory_mb", 2048)),
        disk_mb=math.ceil(_num(envcfg.get("storage_mb"), where, "[environment] storage_mb", 1024)),
        cpus=_num(envcfg.get("cpus"), where, "[environment] cpus", 1.0),
        build=steps or [],
        tests=_dir_copy(d / "tests", "/tests"),
        test_command="bash /tests/test.sh",
        verifier_env={str(k): str(v) for k, v in _table(verifier.get("env"), where, "[verifier] env").items()},
        solution=_dir_copy(d / "solution", "/solution"),
        solution_command="bash /solution/solve.sh" if solve.is_file() else "",
        original_files=_original_protected(steps or []),
        content_hash=hash_paths([d]),
        metadata=meta,
        image=image,
        definition=definition,
    )


# -- terminal-bench 1.x ----------------------------------------------------------------------
def load_terminal_bench(task_dir: Path) -> Task:
    """A terminal-bench 1.x task directory (task.yaml, run-tests.sh, Dockerfile or workspace, solution) as a Task."""
    d = Path(task_dir)
    yml = d / "task.yaml"
    try:
        cfg = yaml.safe_load(_text(yml, str(yml)))
    except yaml.YAMLError as e:
        raise TaskLoadError(yml, f"invalid YAML: {e}") from None
    if not isinstance(cfg, dict):
        raise TaskLoadError(yml, "must be a mapping")
    instruction = cfg.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskLoadError(yml, "missing or empty (required)", "instruction")
    parser = cfg.get("parser_name", "pytest")
    if parser != "pytest":
        raise TaskLoadError(yml, f"only the pytest parser is supported, got {parser!r}", "parser_name")
    if not (d / "run-tests.sh").is_file():
        raise TaskLoadError(d / "run-tests.sh", "missing (required)")
    steps = _workspace_steps(d / "environment", "/app", "environment") or _workspace_steps(d, "/app", ".")
    workdir, env = "/app", {}
    if steps is None:
        if not (d / "Dockerfile").is_file():
            raise TaskLoadError(d / "Dockerfile", "missing (and no workspace/ + setup.sh)")
        build = build_dockerfile(d / "Dockerfile", d, str(d / "Dockerfile"))
        workdir = build.workdir if build.workdir != "/" else "/app"
        steps, env = build.steps, dict(build.env)
    solution_cmd, solution = "", []
    if (d / "solution.sh").is_file():
        solution = [FileCopy(dest="/solution/solution.sh", src=d / "solution.sh", mode=0o755)]
        solution_cmd = "bash /solution/solution.sh"
    elif (d / "solution.yaml").is_file():
        try:
            entries = yaml.safe_load((d / "solution.yaml").read_text()) or []
            script = "\n".join(str(e["command"]).rstrip("\n") for e in entries) + "\n"
        except (yaml.YAMLError, TypeError, KeyError):
            raise TaskLoadError(d / "solution.yaml", "must be a list of {command: ...}", "command") from None
        solution = [FileCopy(dest="/solution/solution.sh", data=script.encode(), mode=0o755)]
        solution_cmd = "bash /solution/solution.sh"
    where = str(yml)
    tests = _dir_copy(d / "tests", "/tests") + [
        FileCopy(dest="/tests/run-tests.sh", src=d / "run-tests.sh", mode=0o755)
    ]
    return Task(
        id=d.name,
        source=d,
        format="terminal-bench",
        instruction=instruction.strip(),
        workdir=workdir,
        grader="pytest",
        env=env,
        agent_timeout_s=_num(cfg.get("max_agent_timeout_sec"), where, "max_agent_timeout_sec", 360.0),
        verifier_timeout_s=_num(cfg.get("max_test_timeout_sec"), where, "max_test_timeout_sec", 60.0),
        build=steps,
        tests=tests,
        test_command="bash /tests/run-tests.sh",
        verifier_env={"TEST_DIR": "/tests"},
        solution=solution,
        solution_command=solution_cmd,
        original_files=_original_protected(steps),
        content_hash=hash_paths([d]),
        metadata={k: cfg[k] for k in ("difficulty", "category", "tags") if k in cfg},
    )


# -- rows ------------------------------------------------------------------------------------
def _json_list(value, where: str, field: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise TaskLoadError(where, "must be a JSON list of test ids", field) from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskLoadError(where, "must be a list of test ids", field)
    return value


def _image_name(value, where: str | Path, field: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value.strip()):
        raise TaskLoadError(where, f"must be a container image name, got {value!r}", field)
    return value.strip()


def _row_image(row: dict, where: str) -> str | None:
    for key in ("docker_image", "image", "image_name"):
        if row.get(key):
            return _image_name(row[key], where, key)
    return None


def _row_workspace(row: dict, base: Path, where: str, image: str | None) -> Path | None:
    """The row's local repo checkout; None when it has only an image (which then holds the repo)."""
    ws = row.get("workspace")
    if not ws:
        if image:
            return None
        raise TaskLoadError(
            where,
            "need a local `workspace` directory with the repo, or a container image "
            "(`docker_image`) to run on sandbox.provider=docker or kubernetes",
            "workspace",
        )
    path = (base / ws).resolve()
    if not path.is_dir():
        raise TaskLoadError(where, f"{ws!r} is not a directory (relative to {base})", "workspace")
    return path


def _repo_steps(ws: Path, where: str, workdir: str) -> list[BuildStep]:
    """A row's local repo checkout copied to `workdir`, committed there as the base when it is not a git repo."""
    return [
        BuildStep(kind="copy", origin=f"{where} workspace", copy=FileCopy(dest=workdir, src=ws)),
        BuildStep(kind="run", origin=f"{where} base commit", command=GIT_BASE_COMMIT, workdir=workdir),
    ]


def _patched_files(patch: str) -> list[str]:
    return sorted(set(re.findall(r"^diff --git a/(\S+) b/", patch, flags=re.M)))


def load_swebench_row(row: dict, rows_file: Path, where: str) -> Task:
    """A SWE-bench row as a Task: its test patch applied at grading, the tests run with swebench's command for the
    row's repo and version, graded by FAIL_TO_PASS and PASS_TO_PASS through swebench's parser and grading."""
    for field in ("instance_id", "problem_statement", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"):
        if field not in row:
            raise TaskLoadError(where, "missing (required)", field)
    f2p = _json_list(row["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
    p2p = _json_list(row["PASS_TO_PASS"], where, "PASS_TO_PASS")
    if not f2p:
        raise TaskLoadError(where, "is empty: the task would pass without a fix", "FAIL_TO_PASS")
    image = _row_image(row, where)
    ws = _row_workspace(row, rows_file.parent, where, image)
    workdir = "/testbed"
    steps = [] if ws is None else _repo_steps(ws, where, workdir)
    test_patch = row["test_patch"]
    # Every file the test patch touches goes back to its base version (written fresh from the
    # task, not from the agent's git history) or is removed; then the patch is applied. Run
    # from the image, the base versions are the ones read from it when the sandbox started.
    fresh, removes = [], []
    for rel in _patched_files(test_patch) if ws is not None else []:
        if (ws / rel).is_file():
            fresh.append(FileCopy(dest=f"{workdir}/{rel}", data=(ws / rel).read_bytes()))
        else:
            removes.append(f"rm -f {shlex.quote(rel)}")
    pre = " && ".join(removes + ["git apply --whitespace=nowarn /tests/test.patch"])
    try:
        official = swebench_harness.test_command(row)
    except swebench_harness.SwebenchMissing as e:
        raise TaskLoadError(where, str(e), "swebench") from None
    if official is None:  # a repo swebench has no spec for: pytest on the files of the test ids
        files = sorted({t.split("::")[0] for t in f2p + p2p})
        official = f"{PYTEST} {' '.join(shlex.quote(f) for f in files)}"
    patch = row.get("patch") or ""
    return Task(
        id=row["instance_id"],
        source=rows_file,
        format="swebench",
        instruction=row["problem_statement"].strip(),
        workdir=workdir,
        grader="swebench",
        build=steps,
        tests=[FileCopy(dest="/tests/test.patch", data=test_patch.encode()), *fresh],
        pre_test_command=pre,
        test_command=(SWEBENCH_IMAGE_ENV if image else "") + official,
        solution=[FileCopy(dest="/solution/gold.patch", data=patch.encode())] if patch else [],
        solution_command="git apply --whitespace=nowarn /solution/gold.patch" if patch else "",
        expected={"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "repo": row.get("repo") or ""},
        original_files=_original_protected(steps),
        content_hash=hash_paths([ws] if ws else [], json.dumps(row, sort_keys=True).encode()),
        metadata={k: row[k] for k in ("repo", "base_commit", "version") if k in row},
        image=image,
        restore_paths=[f"{workdir}/{rel}" for rel in _patched_files(test_patch)],
    )


def _r2e_instruction(row: dict) -> str:
    text = row.get("problem_statement") or row.get("prompt") or ""
    m = re.search(r"\[ISSUE\](.*?)\[/ISSUE\]", text, flags=re.S)
    return (m.group(1) if m else text).strip()


def load_r2e_row(row: dict, rows_file: Path, where: str) -> Task:
    """An R2E-Gym row as a Task: its hidden r2e_tests run at grading, graded against the expected output."""
    if "expected_output_json" not in row:
        raise TaskLoadError(where, "missing (required)", "expected_output_json")
    try:
        expected = (
            json.loads(row["expected_output_json"])
            if isinstance(row["expected_output_json"], str)
            else row["expected_output_json"]
        )
    except ValueError:
        raise TaskLoadError(where, "is not valid JSON", "expected_output_json") from None
    if not isinstance(expected, dict) or not expected:
        raise TaskLoadError(where, "must be a non-empty {test: status} object", "expected_output_json")
    instruction = _r2e_instruction(row)
    if not instruction:
        raise TaskLoadError(where, "missing (need problem_statement or prompt)", "problem_statement")
    image = _row_image(row, where)
    ws = _row_workspace(row, rows_file.parent, where, image)
    workdir = "/testbed"
    tests_dir = (rows_file.parent / row["tests"]).resolve() if row.get("tests") else None
    if tests_dir is not None and not tests_dir.is_dir():
        raise TaskLoadError(where, f"{row['tests']!r} is not a directory (relative to {rows_file.parent})", "tests")
    if tests_dir is None and not image:
        raise TaskLoadError(
            where, "need a local directory with the hidden r2e_tests (or a container image that holds them)", "tests"
        )
    # Without a local workspace AND local tests only the image can run this row (R2E-Gym
    # images keep the hidden tests in /testbed/r2e_tests; they are taken out before the agent).
    steps = [] if ws is None or tests_dir is None else _repo_steps(ws, where, workdir)
    patch = row.get("patch") or ""
    commit = str(row.get("commit_hash", ""))[:8]
    return Task(
        id=row.get("instance_id") or f"{row.get('repo_name', 'repo')}__{commit or rows_file.stem}",
        source=rows_file,
        format="r2e",
        instruction=instruction,
        workdir=workdir,
        grader="r2e",
        build=steps,
        tests=[FileCopy(dest="/tests/r2e_tests", src=tests_dir)] if tests_dir else [],
        test_command=f"{PYTEST} /tests/r2e_tests",
        image=image,
        image_tests="" if tests_dir else f"{workdir}/r2e_tests",
        solution=[FileCopy(dest="/solution/gold.patch", data=patch.encode())] if patch else [],
        solution_command="git apply --whitespace=nowarn /solution/gold.patch" if patch else "",
        expected={"tests": {str(k): str(v) for k, v in expected.items()}},
        original_files=_original_protected(steps),
        content_hash=hash_paths([p for p in (ws, tests_dir) if p], json.dumps(row, sort_keys=True).encode()),
        metadata={k: row[k] for k in ("repo_name", "commit_hash", "docker_image") if k in row},
    )


def iter_rows(rows_file: Path) -> Iterator[Task | TaskLoadError]:
    """Each row of a .json (list) or .jsonl file as a Task, or the error that row has."""
    rows_file = Path(rows_file)
    try:
        text = rows_file.read_text()
    except OSError as e:
        yield TaskLoadError(rows_file, f"cannot read: {e.strerror}")
        return
    rows: list[tuple[str, object]] = []
    if rows_file.suffix == ".jsonl":
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((f"{rows_file}:{i}", json.loads(line)))
                except ValueError as e:
                    rows.append((f"{rows_file}:{i}", TaskLoadError(f"{rows_file}:{i}", f"invalid JSON: {e}")))
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            yield TaskLoadError(rows_file, f"invalid JSON: {e}")
            return
        data = data if isinstance(data, list) else [data]
        rows = [(f"{rows_file}[{i}]", r) for i, r in enumerate(data)]
    for where, row in rows:
        if isinstance(row, TaskLoadError):
            yield row
            continue
        try:
            if not isinstance(row, dict):
                raise TaskLoadError(where, "a row must be a JSON object")
            if "FAIL_TO_PASS" in row:
                yield load_swebench_row(row, rows_file, where)
            elif "expected_output_json" in row:
                yield load_r2e_row(row, rows_file, where)
            else:
                raise TaskLoadError(
                    where, "neither a SWE-bench row (FAIL_TO_PASS) nor an R2E-Gym row (expected_output_json)"
                )
        except TaskLoadError as e:
            yield e


def load_task(path: str | Path) -> Task:
    """A task directory (Harbor `task.toml` or terminal-bench `task.yaml`) as a Task."""
    d = Path(path)
    if (d / "task.toml").is_file():
        return load_harbor(d)
    if (d / "task.yaml").is_file():
        return load_terminal_bench(d)
    if d.is_file() and d.suffix in (".json", ".jsonl"):
        items = list(iter_rows(d))
        if len(items) != 1:
            raise TaskLoadError(d, f"holds {len(items)} rows; use iter_tasks for row files")
        if isinstance(items[0], TaskLoadError):
            raise items[0]
        return items[0]
    raise TaskLoadError(d, "not a task: no task.toml (Harbor) or task.yaml (terminal-bench)")


def iter_tasks(paths: list[str | Path]) -> Iterator[Task | TaskLoadError]:
    """Every task under `paths`: task dirs, dirs of task dirs, and .json/.jsonl row files."""
    for p in map(Path, paths):
        if p.is_file():
            if p.suffix in (".json", ".jsonl"):
                yield from iter_rows(p)
            else:
                yield TaskLoadError(p, "not a task directory or a .json/.jsonl rows file")
        elif (p / "task.toml").is_file() or (p / "task.yaml").is_file():
            try:
                yield load_task(p)
            except TaskLoadError as e:
                yield e
        elif p.is_dir():
            children = sorted(
                c
                for c in p.iterdir()
                if c.is_dir()
                and not c.name.startswith(".")
                and ((c / "task.toml").is_file() or (c / "task.yaml").is_file())
            )
            children += sorted(c for c in p.iterdir() if c.is_file() and c.suffix in (".json", ".jsonl"))
            if not children:
                yield TaskLoadError(p, "contains no task directories or row files")
            yield from iter_tasks(children)
        else:
            yield TaskLoadError(p, "does not exist")

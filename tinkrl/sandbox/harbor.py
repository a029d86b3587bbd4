"""The `harbor` sandbox provider: every sandbox is one of Harbor's environments.

Harbor keeps an environment class per place sandboxes run (docker, Daytona, Modal, E2B,
Runloop and more, used daily against the live services by its users); `sandbox.harbor.environment`
names one, or any class by import path. Harbor needs Python >= 3.12, so its classes run in a
bridge process on the harness virtualenv's interpreter (`tinkrl.sandbox.harbor_bridge`,
`make harness`), one per provider, holding all of the run's environments; this module is the
trainer's side of that pipe.

A sandbox's definition is a directory Harbor reads. A Harbor task whose workspace comes from its
Dockerfile gives its own `environment/` directory: the environment builds that Dockerfile (with
the provider's own image build and caching) and tinkrl runs no build steps. Otherwise it is a
Dockerfile `FROM` the task's image (or `sandbox.harbor.image`) with its workdir, in a minimal
task directory so environments that read a whole task (tinkrl's own `BwrapEnvironment`) can
too, and the task's workspace is then built in the sandbox by its build steps, as on the docker
provider. The spec's CPUs, memory and disk become the environment's resources. Commands run
through the same shell script as the container providers (cwd and exported variables kept
between calls, a deadline on each).

Nothing outlives the run: at most `max_concurrent` sandboxes live at once, a start that fails
on the provider's side is retried with backoff and then recorded as an infrastructure failure,
`close` stops every sandbox, and the bridge stops all of them itself when the trainer exits or
is killed (its stdin closes). A bridge killed with SIGKILL itself leaves its ledger behind (one
file per sandbox it held, see `tinkrl.sandbox.harbor_bridge`): `reap_sandboxes` (`tinkrl sandbox
reap --provider harbor`, and every provider's start unless `reap_on_start` is off) stops the
sandboxes of bridges that are gone. `started`, `failed` and `retried` count what happened.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import tinkrl
from tinkrl.config import HarborSandboxConfig
from tinkrl.sandbox.base import SandboxError, SandboxSpec
from tinkrl.sandbox.build import BuildError
from tinkrl.sandbox.container import (
    HARD_DEADLINE_GRACE_S,
    ContainerProvider,
    ContainerSandbox,
    Owner,
    dns_name,
    task_id_of,
)
from tinkrl.sandbox.files import safe_extract, tar_host_path

BRIDGE_MODULE = "tinkrl.sandbox.harbor_bridge"
CALL_GRACE_S = 60.0  # past an operation's own deadline, how long to wait for the bridge's answer
FILE_OP_TIMEOUT_S = 600.0
REAP_TIMEOUT_S = 600.0  # one reap's stops, all at once


def harness_python(configured: str | None = None) -> Path:
    """The interpreter that runs Harbor: `configured`, else $TINKRL_HARNESS_PYTHON, else `.venv-harness` in the
    working directory or beside tinkrl's source; a SandboxError naming what to do when there is none."""
    if configured or os.environ.get("TINKRL_HARNESS_PYTHON"):
        path = Path(configured or os.environ["TINKRL_HARNESS_PYTHON"]).expanduser()
        if path.exists():
            return path
        raise SandboxError(f"sandbox.harbor.python {path} does not exist", "sandbox_unavailable")
    roots = [Path.cwd(), Path(tinkrl.__file__).resolve().parents[1]]
    for root in roots:
        path = root / ".venv-harness" / "bin" / "python"
        if path.exists():
            return path
    raise SandboxError(
        "the harbor provider runs Harbor in the harness virtualenv, and there is none "
        f"({roots[0] / '.venv-harness'}): run `make harness`, or set sandbox.harbor.python",
        "sandbox_unavailable",
    )


def preflight(config: HarborSandboxConfig, timeout_s: float = 120.0) -> str | None:
    """Why `config`'s environment cannot run (no harness, a type Harbor lacks, missing credentials), in one
    line, or None: Harbor's own preflight, run by the bridge without starting anything."""
    try:
        python = harness_python(config.python)
    except SandboxError as e:
        return str(e)
    argv = [str(python), "-m", BRIDGE_MODULE, "--preflight", config.environment, json.dumps(config.kwargs)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"Harbor's preflight of {config.environment!r} did not answer in {timeout_s:g}s"
    last = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode == 0:
        return None
    if last.startswith("error: "):
        return "sandbox.harbor: " + last.removeprefix("error: ")
    tail = " ".join(r.stderr.strip().splitlines()[-3:])
    return f"sandbox.harbor: {python} could not run Harbor's preflight (exit {r.returncode}): {tail}"


def ledger_dir(config: HarborSandboxConfig) -> Path:
    """Where bridges record their live sandboxes: `sandbox.harbor.ledger`, else $TINKRL_HOME/sandboxes/harbor."""
    if config.ledger:
        return Path(config.ledger).expanduser()
    from tinkrl.local.model_files import tinkrl_home

    return tinkrl_home() / "sandboxes" / "harbor"


def reap_sandboxes(
    config: HarborSandboxConfig, run_id: str | None = None, dry_run: bool = False
) -> list[tuple[str, str]]:
    """Stop the sandboxes in the ledger whose bridge is gone (with `run_id`: every one of that run, live or not);
    returns (sandbox, reason) for each stopped (or, on `dry_run`, that would be). A bridge on another host, or
    one still running, keeps its sandboxes. A SandboxError names the ones that would not stop."""
    leaks: dict[str, tuple[str, str]] = {}
    for path in sorted(ledger_dir(config).glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # being written, or gone: a later reap sees it
        if run_id is not None:
            reason = f"run {run_id}" if entry.get("run_id") == run_id else None
        else:
            reason = "bridge gone" if Owner.recorded(entry, "").process_alive() is False else None
        if reason is not None:
            leaks[str(path)] = (str(entry.get("sid") or path.stem), reason)
    if dry_run or not leaks:
        return list(leaks.values())
    argv = [str(harness_python(config.python)), "-m", BRIDGE_MODULE, "--reap", *leaks]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=REAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SandboxError(
            f"harbor reap: the stops of {len(leaks)} sandbox(es) did not end in {REAP_TIMEOUT_S:g}s; "
            "their ledger files are kept for the next reap",
            "sandbox_error",
        ) from None
    answers: dict[str, dict[str, Any]] = {}
    for line in r.stdout.splitlines():
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            continue
        answers[str(answer.get("file"))] = answer
    done, errors = [], []
    for path, (sid, reason) in leaks.items():
        answer = answers.get(path, {"error": "no answer from the reap"})  # it died first: the file is kept
        if answer.get("ok"):
            done.append((sid, f"{reason}: {answer.get('how')}"))
        else:
            errors.append(f"{sid}: {answer.get('error')}")
    if errors:
        tail = " ".join(r.stderr.strip().splitlines()[-2:])
        raise SandboxError(
            f"harbor reap: {len(errors)} sandbox(es) did not stop ({'; '.join(errors[:3]) or tail}); "
            f"{len(done)} stopped",
            "sandbox_error",
        )
    return done


class Bridge:
    """One bridge process: requests written as JSON lines, answers matched to callers by id (any thread)."""

    def __init__(self, python: Path, log_path: Path):
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - the process writes it for as long as it lives
        self.process = subprocess.Popen(
            [str(python), "-m", BRIDGE_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,  # a terminal's Ctrl-C reaches the trainer; the trainer stops the bridge
        )
        self._ids = itertools.count(1)
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._dead: str | None = None
        threading.Thread(target=self._read, name="harbor-bridge", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self._dead is None and self.process.poll() is None

    def call(self, op: str, timeout: float, **args: Any) -> Any:
        """The result of one request; a SandboxError (or BuildError, FileNotFoundError) when it failed, the
        bridge died, or no answer came within `timeout` seconds."""
        future: Future = Future()
        with self._lock:
            if self._dead is not None:
                raise SandboxError(self._dead, "sandbox_crashed")
            rid = next(self._ids)
            self._pending[rid] = future
            line = json.dumps({"id": rid, "op": op, **args}) + "\n"
            try:
                self.process.stdin.write(line.encode())
                self.process.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._pending.pop(rid, None)
                raise SandboxError(self._death_line(), "sandbox_crashed") from None
        try:
            answer = future.result(timeout=timeout)
        except TimeoutError:
            with self._lock:
                self._pending.pop(rid, None)
            raise SandboxError(f"the Harbor bridge gave no answer to {op} in {timeout:g}s", "sandbox_error") from None
        if answer.get("ok"):
            return answer.get("result")
        error, kind = str(answer.get("error")), answer.get("kind")
        if kind == "missing":
            raise FileNotFoundError(2, error)
        if kind == "build":
            raise BuildError("the sandbox definition", error)
        raise SandboxError(error, "bad_config" if kind == "config" else "sandbox_error")

    def _read(self) -> None:
        for raw in self.process.stdout:
            try:
                answer = json.loads(raw)
            except json.JSONDecodeError:
                continue
            with self._lock:
                future = self._pending.pop(answer.get("id"), None)
            if future is not None:
                future.set_result(answer)
        self.process.wait()
        with self._lock:
            self._dead = self._death_line()
            pending, self._pending = list(self._pending.values()), {}
        for future in pending:
            future.set_exception(SandboxError(self._dead, "sandbox_crashed"))

    def _death_line(self) -> str:
        code = self.process.poll()
        try:
            tail = " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-3:])
        except OSError:
            tail = ""
        return f"the Harbor bridge exited (code {code}); its log {self.log_path} ends: {tail}"

    def close(self, timeout: float = 300.0) -> None:
        """Close its stdin (it stops every environment it holds, then exits) and wait; kill it past `timeout`."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


class HarborSandbox(ContainerSandbox):
    """One Harbor environment: the container sandbox's commands over the bridge, files through Harbor's transfers."""

    provider: HarborProvider

    def __init__(self, provider: HarborProvider, spec: SandboxSpec, name: str, bridge: Bridge, scratch: Path):
        super().__init__(provider, spec, name)
        self.bridge = bridge
        self.scratch = scratch  # a host directory of this sandbox's own, for files on their way in or out

    def _call(self, op: str, timeout: float = FILE_OP_TIMEOUT_S, **args: Any) -> Any:
        return self.bridge.call(op, timeout, sid=self.name, **args)

    def _run(self, argv: list[str], timeout: float, user: str | None = None) -> tuple[int, str, str, bool, bool, float]:
        t0 = time.monotonic()
        r = self._call(
            "exec",
            timeout + HARD_DEADLINE_GRACE_S + CALL_GRACE_S,
            command=shlex.join(argv),
            timeout_s=timeout,
            grace_s=HARD_DEADLINE_GRACE_S,
            user=user,
            max_output_bytes=self.provider.config.max_output_bytes,
        )
        out, err = r.get("stdout") or "", r.get("stderr") or ""
        return int(r["return_code"]), out, err, bool(r["gave_up"]), bool(r["truncated"]), time.monotonic() - t0

    def _shell(self, command: str) -> int:
        return int(
            self._call("exec", 120.0, command=command, timeout_s=60.0, grace_s=HARD_DEADLINE_GRACE_S)["return_code"]
        )

    def _host_path(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(dir=self.scratch)) / name

    def _write(self, path: str, data: bytes, mode: int) -> None:
        host = self._host_path("file")
        host.write_bytes(data)
        parent = str(Path(path).parent)
        if self._shell(f"mkdir -p {shlex.quote(parent)}") != 0:
            raise self._infra(f"cannot create {parent}")
        self._call("upload_file", source=str(host), target=path)
        self._shell(f"chmod {mode:o} {shlex.quote(path)}")
        host.unlink()

    def _read(self, path: str) -> bytes:
        if self._shell(f"test -f {shlex.quote(path)}") != 0:
            raise FileNotFoundError(2, "No such file in the sandbox", path)
        host = self._host_path("file")
        self._call("download_file", source=path, target=str(host))
        data = host.read_bytes()
        host.unlink()
        return data

    def copy_in(self, src: Path, dest: str) -> None:
        """A host file to `dest`, or a host directory's contents into directory `dest` (Harbor's upload_dir)."""
        src = Path(src)
        if not src.is_dir():
            return super().copy_in(src, dest)
        self._check_open()
        if self._shell(f"mkdir -p {shlex.quote(dest)}") != 0:
            raise self._infra(f"cannot create {dest}")
        self._call("upload_dir", source=str(src.resolve()), target=dest)

    def copy_out(self, src: str, dest: Path) -> None:
        """A sandbox file to host path `dest`, or a directory's contents into directory `dest` (Harbor's downloads)."""
        self._check_open()
        dest = Path(dest)
        if self._shell(f"test -d {shlex.quote(src)}") == 0:
            dest.mkdir(parents=True, exist_ok=True)
            self._call("download_dir", source=src, target=str(dest.resolve()))
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(self.read_file(src))

    def _put_tree(self, dest: str, tar: bytes) -> None:
        host = self._host_path("tree")
        safe_extract(tar, host, strip_top=True)
        self._call("upload_dir", source=str(host), target=dest)

    def _get_tree(self, src: str) -> bytes:
        host = self._host_path("tree")
        self.copy_out(src, host)
        return tar_host_path(host, Path(src).name or "root")

    def _destroy(self) -> None:
        try:
            self._call("stop", timeout=300.0)
        except (SandboxError, OSError) as e:
            self.provider.notes.append(f"stopping {self.name}: {e}")
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.provider._slots.release()


class HarborProvider(ContainerProvider):
    """Sandboxes as Harbor environments (see the module docstring); options: `HarborSandboxConfig`'s fields."""

    name = "harbor"
    config_class = HarborSandboxConfig

    def __init__(self, config: HarborSandboxConfig | dict[str, Any] | None = None, **options: Any):
        super().__init__(config, **options)
        self.python = harness_python(self.config.python)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"tinkrl-harbor-{self.run_id}-"))
        self._slots = threading.BoundedSemaphore(self.config.max_concurrent)
        self._bridge: Bridge | None = None
        self._bridge_lock = threading.Lock()
        self._names = itertools.count(1)
        self.started = self.failed = self.retried = 0
        self.hello: dict[str, Any] = {}
        self._bridge_now()  # the environment is checked (type, options, credentials) before any episode
        if self.config.reap_on_start:
            self._reap_gone()
        ref = weakref.ref(self)  # close() normally; at exit for a run that did not
        atexit.register(lambda: (p := ref()) is not None and p.close())

    def _reap_gone(self) -> None:
        """Stop the sandboxes that bridges now gone left in the ledger (a failure is a note, not an error)."""
        try:
            for sid, reason in reap_sandboxes(self.config):
                print(f"harbor sandboxes: stopped {sid} ({reason})", file=sys.stderr)
        except SandboxError as e:
            self.notes.append(str(e))

    def _bridge_now(self) -> Bridge:
        """The live bridge, started (and told the environment) when there is none or the last one died (whose
        sandboxes are then stopped from its ledger, outside the lock: other episodes go on meanwhile)."""
        with self._bridge_lock:
            if self._bridge is not None and self._bridge.alive:
                return self._bridge
            died = self._bridge is not None
            bridge = Bridge(self.python, self.scratch / f"bridge-{int(time.time())}.log")
            try:
                self.hello = bridge.call(
                    "hello",
                    300.0,
                    environment=self.config.environment,
                    kwargs=self.config.kwargs,
                    run_id=self.run_id,
                    ledger=str(ledger_dir(self.config)),
                )
            except BaseException:
                bridge.close(timeout=30)
                raise
            self._bridge = bridge
            self.runs_images = bool(self.hello.get("runs_images", True))
            self.builds_definitions = bool(self.hello.get("builds_definitions", True))
        if died:
            self._reap_gone()
        return bridge

    def definition(self, spec: SandboxSpec) -> Path:
        """The directory Harbor builds a sandbox of `spec` from: the task's own Dockerfile directory when the spec
        names one, else a Dockerfile from its image with its workdir, in a minimal task directory (the same
        directory for every spec of one image and workdir)."""
        if spec.definition:
            return Path(spec.definition)
        image = spec.image or self.config.image
        key = dns_name(f"{image}-{spec.workdir}", 80)
        task = self.scratch / "definitions" / key
        if not (task / "environment" / "Dockerfile").exists():
            (task / "environment").mkdir(parents=True, exist_ok=True)
            (task / "tests").mkdir(exist_ok=True)
            (task / "instruction.md").write_text("A tinkrl sandbox.\n")
            (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
            (task / "task.toml").write_text(
                f'[task]\nname = "tinkrl/sandbox-{key}"\n\n[environment]\nworkdir = {json.dumps(spec.workdir)}\n'
            )
            (task / "environment" / "Dockerfile").write_text(f"FROM {image}\nWORKDIR {spec.workdir}\n")
        return task / "environment"

    def create(self, spec: SandboxSpec) -> HarborSandbox:
        """Start one environment for `spec`, waiting for a free slot; a start that fails on the provider's side is
        retried `start_retries` times with backoff, then raised as a SandboxError (a BuildError is not retried)."""
        self._check_open()
        if not self._slots.acquire(timeout=self.config.start_timeout_s):
            raise SandboxError(
                f"no free harbor sandbox slot in {self.config.start_timeout_s:g}s "
                f"(max_concurrent={self.config.max_concurrent})",
                "sandbox_busy",
            )
        try:
            return self._start(spec)
        except BaseException:
            self._slots.release()
            raise

    def _start(self, spec: SandboxSpec) -> HarborSandbox:
        definition = self.definition(spec)
        wait = self.config.retry_backoff_s
        for attempt in range(self.config.start_retries + 1):
            name = f"tinkrl-{self.run_id}-{dns_name(task_id_of(spec) or 'sandbox', 30)}-{next(self._names)}"
            scratch = self.scratch / name
            scratch.mkdir(parents=True)
            bridge = self._bridge_now()
            try:
                bridge.call(
                    "start",
                    self.config.start_timeout_s + CALL_GRACE_S,
                    sid=name,
                    environment_dir=str(definition),
                    name=task_id_of(spec) or name,
                    session_id=name,
                    trial_dir=str(scratch / "trial"),
                    workdir=spec.workdir,
                    image=spec.image,
                    cpus=spec.cpu,
                    memory_mb=spec.memory_mb,
                    storage_mb=spec.disk_mb,
                    env=spec.env,
                    network=spec.network,
                    build_timeout_s=self.config.start_timeout_s,
                )
            except SandboxError as e:
                if e.failure_mode == "bad_config" or attempt == self.config.start_retries:
                    self.failed += 1
                    raise SandboxError(f"harbor sandbox {name} did not start: {e}", e.failure_mode) from None
                self.retried += 1
                time.sleep(wait)
                wait *= 2
                continue
            except BuildError:
                self.failed += 1
                raise
            sandbox = HarborSandbox(self, spec, name, bridge, scratch)
            self._track(sandbox)
            self.started += 1
            return sandbox
        raise AssertionError("unreachable")

    def summary(self) -> dict[str, int]:
        """What this provider did: sandboxes started, failed to start, and start retries."""
        return {"started": self.started, "failed": self.failed, "retried": self.retried}

    def _release(self) -> None:
        with self._bridge_lock:
            bridge, self._bridge = self._bridge, None
        if bridge is not None:
            died = not bridge.alive
            bridge.close()
            if died:  # what the dead bridge held is still running: stop it from the ledger before leaving
                self._reap_gone()
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.started or self.failed:
            line = f"harbor sandboxes ({self.config.environment}): {self.started} started, {self.failed} failed"
            print(line + f", {self.retried} start(s) retried", file=sys.stderr)
        if self.notes:
            print(f"harbor sandboxes: {'; '.join(self.notes[-3:])}", file=sys.stderr)


__all__ = ["Bridge", "HarborProvider", "HarborSandbox", "harness_python", "ledger_dir", "preflight", "reap_sandboxes"]

"""The process that runs Harbor's environment classes for the `harbor` sandbox provider.

Harbor needs Python >= 3.12; tinkrl's trainer may run on an older one. So the provider
(`tinkrl.sandbox.harbor`) starts this module with the harness virtualenv's interpreter
(`make harness`: `.venv-harness`) and speaks to it in JSON lines over stdin and stdout:

    {"id": 7, "op": "exec", "sid": "s3", "command": "...", "timeout_s": 60}
    {"id": 7, "ok": true, "result": {"stdout": "...", "stderr": "", "return_code": 0, "gave_up": false}}

One request per line, answered in any order (each runs as its own task, so many sandboxes
work at once); a failure is `{"id": 7, "ok": false, "error": "...", "kind": "..."}` where
kind is `config` (bad environment or options, missing credentials), `build` (the definition
did not build: not worth a retry), `missing` (no such file in the sandbox) or `error`.
Files never travel in the pipe: both processes are on one host, so uploads and downloads
name host paths that Harbor's own transfers read and write.

The bridge is also the trainer's watchdog: when its stdin closes (the trainer exited, or
was killed with SIGKILL) or it gets SIGTERM, it stops and deletes every environment it
started before it exits, so a dead run leaves no remote sandbox running. For the one case
it cannot cover, the bridge itself killed with SIGKILL, it keeps a ledger: one JSON file
per environment it holds (how it was made, the service's own sandbox id once started, and
this process's pid and start time), removed when the environment is stopped. `tinkrl
sandbox reap --provider harbor` finds the files of bridges that are gone and hands them to
`--reap`, which stops each environment: through its service's SDK by the recorded id
(E2B, Daytona, Modal, Runloop), else by making the environment again from its record and
stopping it (docker, podman and other environments that find their sandboxes by name).

    python -m tinkrl.sandbox.harbor_bridge             # serve (what the provider runs)
    python -m tinkrl.sandbox.harbor_bridge --preflight ENV [KWARGS_JSON]
                                                       # one line: ok, or why not
    python -m tinkrl.sandbox.harbor_bridge --reap FILE...
                                                       # stop recorded environments: one JSON line each
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

LOG = logging.getLogger("tinkrl.harbor_bridge")
STOP_TIMEOUT_S = 120.0  # one environment's stop at shutdown


class BridgeError(Exception):
    """A request that failed in a way the provider acts on: `kind` says how (see the module docstring)."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind


def environment_class(environment: str) -> type:
    """Harbor's environment class for a type name (`docker`, `daytona`, `modal`, ...) or an import path
    (`module:Class`); a name Harbor lacks, or an SDK extra not installed, is a BridgeError of kind config."""
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.environment_type import EnvironmentType

    try:
        if ":" in environment:
            return EnvironmentFactory.get_environment_class(import_path=environment)
        try:
            env_type = EnvironmentType(environment)
        except ValueError:
            names = ", ".join(EnvironmentFactory.registered_names())
            raise BridgeError(
                f"Harbor has no environment type {environment!r} (it has: {names}; or give module:Class)", "config"
            ) from None
        return EnvironmentFactory.get_environment_class(env_type)
    except BridgeError:
        raise
    except (ImportError, ValueError, TypeError, AttributeError) as e:
        raise BridgeError(f"Harbor environment {environment!r}: {one_line(e)}", "config") from None


def preflight(environment: str, kwargs: dict[str, Any]) -> type:
    """The environment class, after Harbor's own preflight for it (options valid, credentials present)."""
    cls = environment_class(environment)
    try:
        cls.preflight(kwargs=kwargs)
    except SystemExit as e:  # Harbor's preflights exit with the missing credential's message
        raise BridgeError(
            f"{environment}: {e.code if isinstance(e.code, str) else 'preflight failed'}", "config"
        ) from None
    except (ValueError, TypeError) as e:
        raise BridgeError(f"{environment}: {one_line(e)}", "config") from None
    return cls


def make_environment(cls: type, environment: str, kwargs: dict[str, Any], request: dict[str, Any]) -> Any:
    """An environment of `cls` for one start request (definition directory, names, resources, network), not yet
    started; a definition or setting the class refuses is a BridgeError of kind config (no retry makes it start)."""
    from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
    from harbor.models.trial.paths import TrialPaths

    sid = str(request["sid"])
    network = NetworkMode.PUBLIC if request.get("network") else NetworkMode.NO_NETWORK
    config = EnvironmentConfig(
        cpus=request.get("cpus"),
        memory_mb=request.get("memory_mb"),
        storage_mb=request.get("storage_mb"),
        workdir=request.get("workdir"),
        docker_image=request.get("image"),
        build_timeout_sec=float(request.get("build_timeout_s") or 600.0),
        network_mode=network,
    )
    trial = TrialPaths(Path(request["trial_dir"]))
    trial.mkdir()
    try:  # the environment checks its definition, resources and network policy here
        return cls(
            environment_dir=Path(request["environment_dir"]),
            environment_name=str(request.get("name") or sid),
            session_id=str(request.get("session_id") or sid),
            trial_paths=trial,
            task_env_config=config,
            logger=LOG,
            network_policy=NetworkPolicy(network_mode=network),
            persistent_env=dict(request.get("env") or {}),
            **kwargs,
        )
    except Exception as e:  # noqa: BLE001 - the class refused this definition
        raise BridgeError(f"{environment}: {type(e).__name__}: {one_line(e)}", "config") from None


# Where Harbor's remote environments (harbor 0.26) keep the service's sandbox once started: the attribute
# holding the SDK's object, and that object's id attribute. The id is what the service's SDK stops it by.
SERVICE_HANDLES = {
    "e2b": ("_sandbox", "sandbox_id"),
    "daytona": ("_sandbox", "id"),
    "modal": ("_sandbox", "object_id"),
    "runloop": ("_devbox", "id"),
}


def service_id(env_type: str, env: Any) -> str | None:
    """The service's own id of a started environment's sandbox (None for types that find theirs by name)."""
    handle, key = SERVICE_HANDLES.get(env_type, (None, None))
    value = getattr(getattr(env, handle, None), key, None) if handle else None
    return str(value) if value else None


async def kill_by_id(env_type: str, sandbox_id: str) -> None:
    """Stop and delete one service sandbox by its id with the service's own SDK (credentials from the
    environment variables the SDK and Harbor read: E2B_API_KEY, DAYTONA_API_KEY, a Modal token, RUNLOOP_API_KEY)."""
    if env_type == "e2b":
        from e2b import AsyncSandbox

        await AsyncSandbox.kill(sandbox_id)
    elif env_type == "daytona":
        from daytona import AsyncDaytona

        async with AsyncDaytona() as daytona:
            await daytona.delete(await daytona.get(sandbox_id))
    elif env_type == "modal":
        import modal

        sandbox = await modal.Sandbox.from_id.aio(sandbox_id)
        await sandbox.terminate.aio()
    elif env_type == "runloop":
        from runloop_api_client import AsyncRunloop

        async with AsyncRunloop() as client:
            await client.devboxes.shutdown(sandbox_id)
    else:
        raise BridgeError(f"no way to stop a {env_type} sandbox by id", "config")


class Ledger:
    """One JSON file per environment this bridge holds, under `root` (None: no ledger), with this process's pid
    and start time as its owner, for `tinkrl sandbox reap --provider harbor` to find after a SIGKILL."""

    def __init__(self, root: Path | None):
        self.root = root
        self.owner: dict[str, str] = {}
        if root is not None:
            from tinkrl.sandbox.container import Owner

            me = Owner.current()
            self.owner = {"owner-host": me.host, "owner-pid": str(me.pid), "owner-start": me.start}
            root.mkdir(parents=True, exist_ok=True)

    def record(self, sid: str, entry: dict[str, Any]) -> None:
        """Write (or rewrite) the file of `sid`, readable by this user only (it holds the environment's options)."""
        if self.root is None:
            return
        path = self.root / f"{sid}.json"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({**entry, **self.owner, "recorded_at": time.time()}, f)
        tmp.replace(path)

    def forget(self, sid: str) -> None:
        if self.root is not None:
            (self.root / f"{sid}.json").unlink(missing_ok=True)


async def reap_entry(entry: dict[str, Any], scratch: Path) -> str:
    """Stop the environment of one ledger entry: by the service's id where it has one, else by making it again
    from its record (names, definition) and stopping it. Returns how; raises what the stop raised."""
    env_type, sid = str(entry.get("type") or ""), str(entry["sid"])
    if entry.get("service_id") and env_type in SERVICE_HANDLES:
        await kill_by_id(env_type, str(entry["service_id"]))
        return f"{env_type} sandbox {entry['service_id']} stopped by id"
    if env_type in SERVICE_HANDLES:
        return f"its start never finished: no {env_type} id was recorded (the service's lifetime limit ends it)"
    request = dict(entry["start"], trial_dir=str(scratch / sid / "trial"))
    if not Path(request["environment_dir"]).is_dir():  # the run's scratch went with it: a definition of its image
        definition = scratch / sid / "environment"
        definition.mkdir(parents=True)
        (definition / "Dockerfile").write_text(f"FROM {request.get('image') or 'scratch'}\n")
        request["environment_dir"] = str(definition)
    cls = environment_class(str(entry["environment"]))
    env = make_environment(cls, str(entry["environment"]), dict(entry.get("kwargs") or {}), request)
    await asyncio.wait_for(env.stop(delete=True), STOP_TIMEOUT_S)
    return f"{entry['environment']} environment {request.get('session_id') or sid} stopped by name"


async def reap(files: list[str]) -> int:
    """Stop the environment of each ledger file, all at once; one JSON line per file ({"file", "ok", "how" |
    "error"}); a file goes once its environment is stopped. Exit code 1 when any stop failed."""
    import tempfile

    async def one(name: str, scratch: Path) -> dict[str, Any]:
        try:
            how = await reap_entry(json.loads(Path(name).read_text()), scratch)
        except FileNotFoundError:
            how = "already gone"
        except Exception as e:  # noqa: BLE001 - each file gets its line, whatever one raises
            return {"file": name, "ok": False, "error": f"{type(e).__name__}: {one_line(e)}"}
        Path(name).unlink(missing_ok=True)
        return {"file": name, "ok": True, "how": how}

    with tempfile.TemporaryDirectory(prefix="tinkrl-harbor-reap-") as scratch:
        answers = await asyncio.gather(*(one(name, Path(scratch)) for name in files))
    for answer in answers:
        print(json.dumps(answer), flush=True)
    return 0 if all(a["ok"] for a in answers) else 1


def one_line(e: BaseException) -> str:
    """An exception as one line: its type when its message is empty, else the message's lines joined."""
    text = " ".join(str(e).split())
    return text or type(e).__name__


def capped(text: str | None, limit: int) -> tuple[str, bool]:
    """`text` cut to at most about `limit` bytes, its head and tail kept around a marker; whether it was cut."""
    text = text or ""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, False
    half = limit // 2
    cut = len(data) - 2 * half
    kept = data[:half] + f"\n[... {cut} bytes cut ...]\n".encode() + data[-half:]
    return kept.decode("utf-8", "replace"), True


class Bridge:
    """The environments of one trainer, by the provider's sandbox id, and the requests on them."""

    def __init__(self, write: Any):
        self.write = write  # one JSON response line out
        self.cls: type | None = None
        self.environment = self.type = self.run_id = ""
        self.kwargs: dict[str, Any] = {}
        self.ledger = Ledger(None)
        self.envs: dict[str, Any] = {}
        self.starting: set[str] = set()

    # -- requests --------------------------------------------------------------------------
    async def handle(self, request: dict[str, Any]) -> None:
        """Answer one request (its `id` echoed), whatever it raises."""
        rid = request.get("id")
        try:
            result = await getattr(self, "op_" + str(request.get("op")), self.op_unknown)(request)
            self.write({"id": rid, "ok": True, "result": result})
        except BridgeError as e:
            self.write({"id": rid, "ok": False, "error": str(e), "kind": e.kind})
        except FileNotFoundError as e:
            self.write({"id": rid, "ok": False, "error": one_line(e), "kind": "missing"})
        except Exception as e:  # noqa: BLE001 - any provider failure goes back to the trainer as one line
            LOG.exception("request %s failed", request.get("op"))
            kind = "build" if type(e).__name__ == "SandboxBuildFailedError" else "error"
            self.write({"id": rid, "ok": False, "error": f"{type(e).__name__}: {one_line(e)}", "kind": kind})

    async def op_unknown(self, request: dict[str, Any]) -> None:
        raise BridgeError(f"unknown request {request.get('op')!r}", "config")

    async def op_hello(self, request: dict[str, Any]) -> dict[str, Any]:
        """Choose the environment class for this trainer (checked by its preflight). `runs_images`: False when the
        class says it starts no container images; `builds_definitions`: False when it says it cannot build a task's
        own Dockerfile directory (class attributes; Harbor's own classes do both)."""
        self.environment = str(request["environment"])
        self.kwargs = dict(request.get("kwargs") or {})
        self.cls = preflight(self.environment, self.kwargs)
        self.type = str(getattr(self.cls.type(), "value", self.cls.type()))
        self.run_id = str(request.get("run_id") or "")
        self.ledger = Ledger(Path(request["ledger"]) if request.get("ledger") else None)
        import harbor

        return {
            "python": sys.version.split()[0],
            "harbor": getattr(harbor, "__version__", ""),
            "type": self.type,
            "runs_images": bool(getattr(self.cls, "runs_images", True)),
            "builds_definitions": bool(getattr(self.cls, "builds_definitions", True)),
        }

    async def op_start(self, request: dict[str, Any]) -> dict[str, Any]:
        """Make and start one environment from a definition directory (its Dockerfile) and resources."""
        if self.cls is None:
            raise BridgeError("start before hello", "config")
        sid = str(request["sid"])
        env = make_environment(self.cls, self.environment, self.kwargs, request)
        entry = {"sid": sid, "run_id": self.run_id, "environment": self.environment, "type": self.type}
        entry |= {"kwargs": self.kwargs, "start": {k: v for k, v in request.items() if k not in ("id", "op")}}
        self.ledger.record(sid, {**entry, "service_id": None})
        self.starting.add(sid)
        try:
            self.envs[sid] = env
            await env.start(force_build=bool(request.get("force_build")))
        except BaseException:
            env = self.envs.pop(sid, None)
            if env is not None:
                await self._stop(sid, env)
            raise
        finally:
            self.starting.discard(sid)
        service = service_id(self.type, env)
        self.ledger.record(sid, {**entry, "service_id": service})
        return {"session_id": env.session_id, "service_id": service}

    def _env(self, request: dict[str, Any]) -> Any:
        env = self.envs.get(str(request.get("sid")))
        if env is None:
            raise BridgeError(f"no live sandbox {request.get('sid')!r} in this bridge", "error")
        return env

    async def op_exec(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one command; `gave_up` when it outlived its timeout plus `grace_s` (the caller then kills it)."""
        env = self._env(request)
        timeout = float(request.get("timeout_s") or 60.0)
        grace = float(request.get("grace_s") or 15.0)
        call = env.exec(
            str(request["command"]),
            cwd=request.get("cwd"),
            env=request.get("env") or None,
            timeout_sec=max(1, int(timeout + grace)),
            user=request.get("user"),
        )
        try:
            r = await asyncio.wait_for(call, timeout + grace)
        except TimeoutError:
            return {"stdout": "", "stderr": "", "return_code": -1, "gave_up": True, "truncated": False}
        limit = int(request.get("max_output_bytes") or 64 * 1024)
        out, cut_out = capped(r.stdout, limit)
        err, cut_err = capped(r.stderr, limit)
        return {
            "stdout": out,
            "stderr": err,
            "return_code": r.return_code,
            "gave_up": False,
            "truncated": cut_out or cut_err,
        }

    async def op_upload_file(self, request: dict[str, Any]) -> None:
        await self._env(request).upload_file(request["source"], request["target"])

    async def op_upload_dir(self, request: dict[str, Any]) -> None:
        await self._env(request).upload_dir(request["source"], request["target"])

    async def op_download_file(self, request: dict[str, Any]) -> None:
        await self._env(request).download_file(request["source"], request["target"])

    async def op_download_dir(self, request: dict[str, Any]) -> None:
        await self._env(request).download_dir(request["source"], request["target"])

    async def op_stop(self, request: dict[str, Any]) -> None:
        """Stop and delete one environment (nothing to do when it is gone already)."""
        env = self.envs.pop(str(request.get("sid")), None)
        if env is not None:
            await self._stop(str(request.get("sid")), env, raise_errors=True)

    async def op_live(self, request: dict[str, Any]) -> list[str]:
        """The sandbox ids this bridge holds (started or starting)."""
        return sorted(set(self.envs) | self.starting)

    # -- shutdown --------------------------------------------------------------------------
    async def _stop(self, sid: str, env: Any, raise_errors: bool = False) -> None:
        """Stop and delete one environment; its ledger file goes only once that worked (else a reaper may)."""
        try:
            await asyncio.wait_for(env.stop(delete=True), STOP_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - at shutdown every environment gets its stop, whatever one raises
            LOG.warning("stopping %s: %s", sid, one_line(e))
            if raise_errors:
                raise
            return
        self.ledger.forget(sid)

    async def stop_all(self) -> None:
        """Stop and delete every environment still held (at exit: nothing may outlive the trainer)."""
        envs, self.envs = self.envs, {}
        await asyncio.gather(*(self._stop(sid, env) for sid, env in envs.items()))


async def serve() -> None:
    """Read requests from stdin until it closes (or SIGTERM), then stop every environment and return."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout

    def write(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    bridge = Bridge(write)
    done = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, done.set)
    tasks: set[asyncio.Task] = set()

    async def read() -> None:
        while line := await reader.readline():
            try:
                request = json.loads(line)
            except json.JSONDecodeError:
                write({"id": None, "ok": False, "error": "a request that is not JSON", "kind": "config"})
                continue
            task = asyncio.create_task(bridge.handle(request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        done.set()

    reading = asyncio.create_task(read())
    await done.wait()
    reading.cancel()
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await bridge.stop_all()


def main(argv: list[str]) -> int:
    """Serve the provider, or (`--preflight ENV [KWARGS_JSON]`) check one environment and print one line, or
    (`--reap FILE...`) stop the environments of ledger files."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    # tools installed in this interpreter's virtualenv (podman-compose for Harbor's podman environment) are found
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if argv[:1] == ["--reap"]:
        return asyncio.run(reap(argv[1:]))
    if argv[:1] == ["--preflight"]:
        environment = argv[1] if len(argv) > 1 else "docker"
        try:
            cls = preflight(environment, json.loads(argv[2]) if len(argv) > 2 else {})
        except BridgeError as e:
            print(f"error: {e}")
            return 2
        print(f"ok: {environment} -> {cls.__module__}:{cls.__qualname__}")
        return 0
    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

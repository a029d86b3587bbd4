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
started before it exits, so a dead run leaves no remote sandbox running.

    python -m tinkrl.sandbox.harbor_bridge             # serve (what the provider runs)
    python -m tinkrl.sandbox.harbor_bridge --preflight ENV [KWARGS_JSON]
                                                       # one line: ok, or why not
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
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
        self.environment = ""
        self.kwargs: dict[str, Any] = {}
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
        import harbor

        return {
            "python": sys.version.split()[0],
            "harbor": getattr(harbor, "__version__", ""),
            "type": str(getattr(self.cls.type(), "value", self.cls.type())),
            "runs_images": bool(getattr(self.cls, "runs_images", True)),
            "builds_definitions": bool(getattr(self.cls, "builds_definitions", True)),
        }

    async def op_start(self, request: dict[str, Any]) -> dict[str, Any]:
        """Make and start one environment from a definition directory (its Dockerfile) and resources."""
        from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
        from harbor.models.trial.paths import TrialPaths

        if self.cls is None:
            raise BridgeError("start before hello", "config")
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
        try:  # the environment checks its definition, resources and network policy here: a config problem
            env = self.cls(
                environment_dir=Path(request["environment_dir"]),
                environment_name=str(request.get("name") or sid),
                session_id=str(request.get("session_id") or sid),
                trial_paths=trial,
                task_env_config=config,
                logger=LOG,
                network_policy=NetworkPolicy(network_mode=network),
                persistent_env=dict(request.get("env") or {}),
                **self.kwargs,
            )
        except Exception as e:  # noqa: BLE001 - the class refused this definition: no retry makes it start
            raise BridgeError(f"{self.environment}: {type(e).__name__}: {one_line(e)}", "config") from None
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
        return {"session_id": env.session_id}

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
        try:
            await asyncio.wait_for(env.stop(delete=True), STOP_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - at shutdown every environment gets its stop, whatever one raises
            LOG.warning("stopping %s: %s", sid, one_line(e))
            if raise_errors:
                raise

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
    """Serve the provider, or (`--preflight ENV [KWARGS_JSON]`) check one environment and print one line."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
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

"""The `docker` sandbox provider: one container per episode through the Docker Engine API.

Works against Docker Engine and against Podman's Docker-compatible socket (`podman system
service`). Each container gets the task's image, CPU/memory/pids limits, a size-capped
/tmp, no network unless the task asks for it, and labels naming its run, task and owner
process. Leaked containers (their owner process is gone, or their TTL passed) are removed
when a provider starts and when it closes; `tinkrl sandbox reap --provider docker` does
the same by hand. Commands run through `exec` with a deadline (see `container.exec_script`).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import uuid
import weakref
from typing import Any

from tinkrl.config import DockerSandboxConfig
from tinkrl.sandbox.base import SandboxError, SandboxSpec
from tinkrl.sandbox.container import (
    HARD_DEADLINE_GRACE_S,
    KEEPALIVE,
    Capture,
    ContainerProvider,
    ContainerSandbox,
    Owner,
    dns_name,
    shell_argv,
    task_id_of,
)
from tinkrl.sandbox.files import first_file_in_tar, tar_file_bytes

LABEL = "tinkrl"  # label prefix: tinkrl.managed, tinkrl.run-id, ...
SOCKETS = ("/var/run/docker.sock", "/run/podman/podman.sock")


def _client(cfg: DockerSandboxConfig):
    try:
        import docker  # the Docker SDK; imported lazily so bwrap-only installs never need it
    except ModuleNotFoundError:
        raise SandboxError(
            "the docker provider needs the docker SDK: pip install 'tinkrl[cluster]'", "sandbox_unavailable"
        ) from None
    url = cfg.base_url or os.environ.get("DOCKER_HOST")
    if not url:
        found = [s for s in SOCKETS if os.path.exists(s)]
        if not found:
            raise SandboxError(
                f"no Docker engine: set sandbox.docker.base_url or DOCKER_HOST (no socket at {' or '.join(SOCKETS)})",
                "sandbox_unavailable",
            )
        url = "unix://" + found[0]
    try:
        client = docker.DockerClient(base_url=url, timeout=int(cfg.api_timeout_s))
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure to reach the engine reads the same to the user
        raise SandboxError(f"cannot reach the Docker engine at {url}: {e}", "sandbox_unavailable") from None
    return client


def owner_labels(owner: Owner, run_id: str, task_id: str, ttl_s: float, provider_id: str) -> dict[str, str]:
    """The labels that let a reaper tell whose container this is and when it expires."""
    return {
        f"{LABEL}.managed": "true",
        f"{LABEL}.run-id": run_id,
        f"{LABEL}.task-id": task_id,
        f"{LABEL}.owner": owner.name,
        f"{LABEL}.owner-host": owner.host,
        f"{LABEL}.owner-pid": str(owner.pid),
        f"{LABEL}.owner-start": owner.start,
        f"{LABEL}.provider-id": provider_id,
        f"{LABEL}.expires-at": str(int(time.time() + ttl_s)),
    }


def leak_reason(labels: dict[str, str], now: float | None = None) -> str | None:
    """Why a tinkrl container is a leak (owner process dead, TTL passed), or None if it is live."""
    now = time.time() if now is None else now
    try:
        if float(labels.get(f"{LABEL}.expires-at", "inf")) < now:
            return "expired"
    except ValueError:
        pass
    if Owner.recorded(labels, f"{LABEL}.").process_alive() is False:
        return "owner gone"
    return None


def reap_containers(
    client, run_id: str | None = None, dry_run: bool = False, now: float | None = None
) -> list[tuple[str, str]]:
    """Remove leaked tinkrl containers; with `run_id`, every container of that run.

    Returns (container name, reason) for each one removed (or that would be, on dry_run).
    A container whose owner lives on another host is only removed once its TTL passes.
    """
    flt = {"label": [f"{LABEL}.managed=true"] + ([f"{LABEL}.run-id={run_id}"] if run_id else [])}
    done = []
    for c in client.containers.list(all=True, filters=flt):
        reason = f"run {run_id}" if run_id else leak_reason(c.labels, now)
        if reason is None:
            continue
        if not dry_run:
            try:
                c.remove(force=True)
            except Exception as e:  # noqa: BLE001 - already gone, or the engine refused: report and go on
                if "404" not in str(e) and "No such container" not in str(e):
                    reason += f" (remove failed: {e})"
        done.append((c.name, reason))
    return done


class DockerSandbox(ContainerSandbox):
    """One running container; every call goes through the Engine API."""

    provider: DockerProvider

    def __init__(self, provider: DockerProvider, spec: SandboxSpec, container):
        super().__init__(provider, spec, container.name)
        self.container = container
        self._api = provider.client.api

    def _run(self, argv: list[str], timeout: float, user: str | None = None) -> tuple[int, str, str, bool, bool, float]:
        limit = self.provider.config.max_output_bytes
        out, err = Capture(limit), Capture(limit)
        t0 = time.monotonic()
        try:
            ex = self._api.exec_create(
                self.container.id, argv, stdout=True, stderr=True, stdin=False, tty=False, user=user or ""
            )
            stream = self._api.exec_start(ex["Id"], stream=True, demux=True)
        except Exception as e:  # noqa: BLE001
            raise self._infra(f"exec failed: {e}") from None

        def pump():
            try:
                for o, e in stream:
                    if o:
                        out.add(o)
                    if e:
                        err.add(e)
            except Exception:  # noqa: BLE001 - the stream died with the container; judged below
                pass

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        reader.join(timeout + HARD_DEADLINE_GRACE_S)
        gave_up = reader.is_alive()
        code = -1
        if not gave_up:
            try:
                info = self._api.exec_inspect(ex["Id"])
                code = info.get("ExitCode")
                code = -1 if code is None else int(code)
            except Exception as e:  # noqa: BLE001
                raise self._infra(f"exec inspect failed: {e}") from None
        o, ot = out.result()
        e_, et = err.result()
        return code, o, e_, gave_up, ot or et, time.monotonic() - t0

    def _mkdir(self, path: str) -> None:
        code, out, err, *_ = self._run(["mkdir", "-p", path], 30.0)
        if code != 0:
            raise self._infra(f"mkdir {path} failed: {(out + err).strip()}")

    def _put(self, dest_dir: str, tar: bytes) -> None:
        try:
            ok = self._api.put_archive(self.container.id, dest_dir, tar)
        except Exception as e:  # noqa: BLE001
            raise self._infra(f"copy into {dest_dir} failed: {e}") from None
        if not ok:
            raise self._infra(f"copy into {dest_dir} failed")

    def _get_tree(self, src: str) -> bytes:
        import docker.errors

        try:
            stream, _ = self._api.get_archive(self.container.id, src)
            return b"".join(stream)
        except docker.errors.NotFound:
            raise FileNotFoundError(2, "No such file or directory", src) from None
        except Exception as e:  # noqa: BLE001
            raise self._infra(f"copy out of {src} failed: {e}") from None

    def _write(self, path: str, data: bytes, mode: int) -> None:
        parent, name = os.path.split(path)
        self._mkdir(parent or "/")
        self._put(parent or "/", tar_file_bytes(name, data, mode))

    def _read(self, path: str) -> bytes:
        return first_file_in_tar(self._get_tree(path), path)

    def _put_tree(self, dest: str, tar: bytes) -> None:
        self._mkdir(dest)
        self._put(dest, tar)

    def _destroy(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception as e:  # noqa: BLE001 - gone already is fine; anything else is left to the reaper
            if "404" not in str(e) and "No such container" not in str(e):
                self.provider.notes.append(f"could not remove container {self.name}: {e}")


class DockerProvider(ContainerProvider):
    """Creates docker/podman containers. Options: the fields of `DockerSandboxConfig`."""

    name = "docker"
    config_class = DockerSandboxConfig
    config: DockerSandboxConfig

    def __init__(self, config: DockerSandboxConfig | dict[str, Any] | None = None, **options: Any):
        super().__init__(config, **options)
        self.client = _client(self.config)
        self.provider_id = uuid.uuid4().hex[:12]
        if self.config.reap_on_start:
            for name, reason in reap_containers(self.client):
                self.notes.append(f"removed leaked container {name} ({reason})")
        # Leaks at exit: close() normally; the atexit hook covers a run that forgot to.
        ref = weakref.ref(self)
        atexit.register(lambda: (p := ref()) is not None and p.close())

    def _image(self, spec: SandboxSpec) -> str:
        """The image, pulled first as `sandbox.docker.pull` says."""
        image = super()._image(spec)
        import docker.errors

        if self.config.pull == "always":
            need = True
        else:
            try:
                self.client.images.get(image)
                need = False
            except docker.errors.ImageNotFound:
                need = True
        if need and self.config.pull == "never":
            raise SandboxError(f"image {image} is not present and sandbox.docker.pull is never", "image_pull")
        if need:
            try:
                self.client.images.pull(image)
            except Exception as e:  # noqa: BLE001
                raise SandboxError(f"cannot pull image {image}: {e}", "image_pull") from None
        return image

    def create(self, spec: SandboxSpec | None = None) -> DockerSandbox:
        self._check_open()
        spec = spec or SandboxSpec()
        image = self._image(spec)
        task_id = task_id_of(spec)
        run_id = spec.labels.get("run_id") or self.run_id
        labels = {f"{LABEL}.{k.replace('_', '-')}": str(v) for k, v in spec.labels.items()}
        labels.update(owner_labels(self.owner, run_id, task_id, self.config.ttl_s, self.provider_id))
        name = f"tinkrl-{dns_name(run_id, 16)}-{dns_name(task_id or 'sbx', 24)}-{uuid.uuid4().hex[:8]}"
        kwargs: dict[str, Any] = dict(
            command=shell_argv("mkdir -p /logs/verifier /tests 2>/dev/null; " + KEEPALIVE),
            entrypoint=[],
            name=name,
            detach=True,
            labels=labels,
            hostname="sandbox",
            working_dir=spec.workdir,
            environment=dict(spec.env),
            mem_limit=f"{spec.memory_mb}m",
            memswap_limit=f"{spec.memory_mb}m",
            nano_cpus=int(spec.cpu * 1e9),
            pids_limit=spec.pids,
            tmpfs={"/tmp": f"size={spec.disk_mb}m"},
            network_mode=self.config.network if spec.network else "none",
        )
        if self.config.no_new_privileges:
            kwargs["security_opt"] = ["no-new-privileges"]
        try:
            container = self.client.containers.run(image, **kwargs)
        except Exception as e:  # noqa: BLE001
            # a half-created container carries our labels; remove it now rather than leak it
            try:
                self.client.containers.get(name).remove(force=True)
            except Exception:  # noqa: BLE001
                pass
            raise SandboxError(f"cannot start a container from {image}: {e}", "sandbox_start") from None
        sb = DockerSandbox(self, spec, container)
        self._track(sb)
        return sb

    def _release(self) -> None:
        """Remove any container of this provider still there, reap leaks, and close the engine client."""
        try:
            flt = {"label": [f"{LABEL}.provider-id={self.provider_id}"]}
            for c in self.client.containers.list(all=True, filters=flt):
                c.remove(force=True)
            reap_containers(self.client)
        except Exception as e:  # noqa: BLE001 - at exit, a missing engine must not raise
            self.notes.append(f"cleanup at close failed: {e}")
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass

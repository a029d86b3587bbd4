"""The `kubernetes` sandbox provider: one pod per sandbox, created and deleted through the
Kubernetes API (the official `kubernetes` client), exec and file copy over the exec stream.

Unusual choices, each for a failure seen in the field (see docs/cluster.md):
- every sandbox gets its own `Configuration` and `ApiClient`: a shared global client
  raced under concurrency (requests without auth, 401s on delete, leaked pods), and the
  client's `stream()` patches its ApiClient while a stream is open;
- pods carry labels (managed-by, run id, task id, owner) and an `expires-at` annotation,
  plus `activeDeadlineSeconds`, so a reaper can find leaks and the kubelet stops them;
- the readiness wait says *why* a pod never ran (image pull, unschedulable, ...) instead
  of just timing out;
- file transfers use base64 over stdin bounded by `head -c N`, so they work on servers
  that cannot half-close stdin (v4 channel protocol) and never depend on text decoding.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shlex
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from tinkrl.config import KubernetesSandboxConfig
from tinkrl.sandbox.base import SandboxError, SandboxSpec
from tinkrl.sandbox.container import (
    HARD_DEADLINE_GRACE_S,
    KEEPALIVE,
    Capture,
    ContainerProvider,
    ContainerSandbox,
    Owner,
    dns_name,
    label_value,
    shell_argv,
    task_id_of,
)

DOMAIN = "tinkrl.dev"
MANAGED = {"app.kubernetes.io/managed-by": "tinkrl", "app.kubernetes.io/component": "sandbox"}
CONTAINER = "sandbox"
PULL_FAILURES = {"ErrImagePull", "ImagePullBackOff"}
FATAL_WAITING = {
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}
RETRY_STATUSES = {429, 500, 502, 503, 504}


def _k8s():
    try:
        import kubernetes  # noqa: F401 - imported lazily so bwrap-only installs never need it
    except ModuleNotFoundError:
        raise SandboxError(
            "the kubernetes provider needs the kubernetes client: pip install 'tinkrl[cluster]'", "sandbox_unavailable"
        ) from None
    from kubernetes import client, config

    return client, config


def api_client(kubeconfig: str | None = None, context: str | None = None):
    """An ApiClient on its own Configuration (never the client's global default): in-cluster credentials
    inside a pod when no kubeconfig is named, else the kubeconfig (default ~/.kube/config) and context."""
    client, config = _k8s()
    conf = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=conf)
        else:
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=conf, persist_config=False
            )
    except Exception as e:  # noqa: BLE001 - a missing/bad kubeconfig reads the same to the user
        raise SandboxError(
            f"cannot load Kubernetes credentials ({kubeconfig or 'default kubeconfig'}): {e}", "sandbox_unavailable"
        ) from None
    return client.ApiClient(configuration=conf)


def new_api(cfg: KubernetesSandboxConfig):
    """A CoreV1Api on its own Configuration and ApiClient (never the client's global default)."""
    client, _ = _k8s()
    return client.CoreV1Api(api_client(cfg.kubeconfig, cfg.context))


def _status_of(e: Exception) -> int:
    return int(getattr(e, "status", 0) or 0)


def api_message(e: Exception) -> str:
    """A Kubernetes API error's own message (its JSON body's), else its reason."""
    body = getattr(e, "body", None)
    try:
        return json.loads(body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(getattr(e, "reason", "") or e)


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_rfc3339(s: str) -> float:
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _quantity_cpu(cores: float) -> str:
    return f"{max(1, int(round(cores * 1000)))}m"


def pod_manifest(
    cfg: KubernetesSandboxConfig, spec: SandboxSpec, name: str, image: str, run_id: str, owner: Owner
) -> dict[str, Any]:
    """The pod body for one sandbox (a plain dict, as the API takes it)."""
    task_id = task_id_of(spec)
    labels = {
        **cfg.labels,
        **MANAGED,
        f"{DOMAIN}/run-id": label_value(run_id),
        f"{DOMAIN}/task-id": label_value(task_id or "none"),
        f"{DOMAIN}/owner": label_value(owner.name),
        f"{DOMAIN}/network": "egress" if spec.network else "none",
    }
    annotations = {
        f"{DOMAIN}/expires-at": _rfc3339(time.time() + cfg.ttl_s),
        f"{DOMAIN}/task-id": task_id,
        f"{DOMAIN}/owner-kind": "pod" if owner.pod else "process",
        f"{DOMAIN}/owner": owner.name,
        f"{DOMAIN}/owner-namespace": owner.namespace or cfg.namespace,
        f"{DOMAIN}/owner-uid": owner.pod_uid,
        f"{DOMAIN}/owner-host": owner.host,
        f"{DOMAIN}/owner-pid": str(owner.pid),
        f"{DOMAIN}/owner-start": owner.start,
    }
    mem = f"{spec.memory_mb}Mi"
    requests = {"cpu": _quantity_cpu(spec.cpu), "memory": mem, "ephemeral-storage": f"{spec.disk_mb}Mi"}
    limits = {
        "cpu": _quantity_cpu(spec.cpu * cfg.cpu_limit_factor),
        "memory": f"{int(spec.memory_mb * cfg.memory_limit_factor)}Mi",
        "ephemeral-storage": f"{spec.disk_mb * 2}Mi",
    }
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": shell_argv("mkdir -p /logs/verifier /tests 2>/dev/null; " + KEEPALIVE),
        "workingDir": spec.workdir,
        "env": [{"name": k, "value": v} for k, v in spec.env.items()],
        "resources": {"requests": requests, "limits": limits},
        "stdin": False,
        "tty": False,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "activeDeadlineSeconds": int(cfg.ttl_s),
    }
    if cfg.node_selector:
        pod_spec["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        pod_spec["tolerations"] = list(cfg.tolerations)
    if cfg.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in cfg.image_pull_secrets]
    if cfg.service_account:
        pod_spec["serviceAccountName"] = cfg.service_account
    if cfg.run_as_user is not None:
        pod_spec["securityContext"] = {"runAsUser": cfg.run_as_user}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": cfg.namespace, "labels": labels, "annotations": annotations},
        "spec": pod_spec,
    }


def not_ready_reason(pod) -> tuple[str, str] | None:
    """(failure_mode, why) when a pod's status explains why it is not running, else None."""
    st = pod.status
    for cs in (st.container_statuses or []) if st else []:
        waiting = cs.state.waiting if cs.state else None
        if waiting and waiting.reason in PULL_FAILURES | FATAL_WAITING:
            mode = (
                "image_pull"
                if waiting.reason in PULL_FAILURES | {"ErrImageNeverPull", "InvalidImageName"}
                else "sandbox_start"
            )
            return mode, f"{waiting.reason}: {waiting.message or ''}".strip(": ")
        terminated = cs.state.terminated if cs.state else None
        if terminated:
            return "sandbox_start", f"container exited ({terminated.reason or terminated.exit_code})"
    for cond in (st.conditions or []) if st else []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return "unschedulable", f"unschedulable: {cond.message or cond.reason}"
    return None


class KubernetesSandbox(ContainerSandbox):
    """One pod, with its own API client."""

    provider: KubernetesProvider

    def __init__(self, provider: KubernetesProvider, spec: SandboxSpec, name: str):
        super().__init__(provider, spec, name)
        self.namespace = provider.config.namespace
        self.api = new_api(provider.config)
        self._lock = threading.Lock()  # one stream at a time per ApiClient (stream() patches it)

    # -- start ---------------------------------------------------------------------------
    def _create(self, body: dict) -> None:
        cfg = self.provider.config
        delay = 1.0
        for attempt in range(6):
            try:
                self.api.create_namespaced_pod(self.namespace, body, _request_timeout=cfg.request_timeout_s)
                return
            except Exception as e:  # noqa: BLE001
                code = _status_of(e)
                if code == 409:  # the name is taken (e.g. a retried create that did land): pick another
                    self.name = body["metadata"]["name"] = f"{self.name.rsplit('-', 1)[0]}-{uuid.uuid4().hex[:6]}"
                elif code in RETRY_STATUSES and attempt < 5:
                    time.sleep(delay)
                    delay = min(delay * 2, 30)
                elif code == 403:
                    raise SandboxError(
                        f"not allowed to create pods in namespace {self.namespace}: {api_message(e)}",
                        "sandbox_forbidden",
                    ) from None
                else:
                    raise SandboxError(
                        f"cannot create pod in {self.namespace}: {api_message(e)}", "sandbox_start"
                    ) from None
        raise SandboxError(f"cannot create pod in {self.namespace}: API kept refusing", "sandbox_start")

    def _wait_ready(self) -> None:
        cfg = self.provider.config
        deadline = time.monotonic() + cfg.ready_timeout_s
        last = None
        while True:
            try:
                pod = self.api.read_namespaced_pod(self.name, self.namespace, _request_timeout=cfg.request_timeout_s)
            except Exception as e:  # noqa: BLE001
                if _status_of(e) == 404:
                    raise SandboxError(f"pod {self.name} disappeared while starting", "sandbox_start") from None
                if _status_of(e) not in RETRY_STATUSES:
                    raise SandboxError(f"cannot read pod {self.name}: {api_message(e)}", "sandbox_start") from None
                pod = None
            if pod is not None:
                phase = pod.status.phase if pod.status else None
                statuses = (pod.status.container_statuses or []) if pod.status else []
                if phase == "Running" and statuses and all(cs.state and cs.state.running for cs in statuses):
                    return
                last = not_ready_reason(pod)
                if phase in ("Failed", "Succeeded"):
                    why = last[1] if last else (pod.status.message or pod.status.reason or phase)
                    raise SandboxError(
                        f"pod {self.name} ended before it was ready ({phase}): {why}",
                        last[0] if last else "sandbox_start",
                    )
                if last and last[1].split(":")[0] in FATAL_WAITING:
                    raise SandboxError(f"pod {self.name} cannot start: {last[1]}", last[0])
                if last is None and phase:
                    last = ("sandbox_start_timeout", f"still {phase}")
            if time.monotonic() >= deadline:
                mode, why = last or ("sandbox_start_timeout", "no status yet")
                raise SandboxError(
                    f"pod {self.name} not ready after {cfg.ready_timeout_s:g}s: {why}",
                    mode if mode != "sandbox_start" else "sandbox_start_timeout",
                )
            time.sleep(min(cfg.poll_interval_s, max(0.0, deadline - time.monotonic())))

    # -- exec stream ---------------------------------------------------------------------
    def _stream(
        self, argv: list[str], timeout: float, stdin: bytes | None = None, limit: int | None = None
    ) -> tuple[int, str | bytes, str, bool, bool, float]:
        """(exit code, stdout, stderr, gave_up, truncated, seconds). limit=None keeps stdout whole, as bytes."""
        from kubernetes.stream import stream

        t0 = time.monotonic()
        out_raw = bytearray()
        out = Capture(limit) if limit else None
        err = Capture(limit or self.provider.config.max_output_bytes)
        with self._lock:
            try:
                ws = stream(
                    self.api.connect_get_namespaced_pod_exec,
                    self.name,
                    self.namespace,
                    command=argv,
                    container=CONTAINER,
                    stdin=stdin is not None,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    _preload_content=False,
                    binary=True,
                )
            except Exception as e:  # noqa: BLE001
                raise self._infra(f"exec failed to start: {api_message(e)}") from None
            try:
                if stdin is not None:
                    for i in range(0, len(stdin), 1 << 20):
                        ws.write_stdin(stdin[i : i + (1 << 20)])
                    ws.close_channel(0)  # v5: EOF on stdin (v4 cannot; our readers stop by length)
                deadline = t0 + timeout + HARD_DEADLINE_GRACE_S
                while True:
                    if o := ws.read_stdout():
                        out.add(o) if out else out_raw.extend(o)
                    if e := ws.read_stderr():
                        err.add(e)
                    if not ws.is_open() or time.monotonic() >= deadline:
                        break
                    ws.update(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                gave_up = ws.is_open()
                code = -1 if gave_up else self._exit_code(ws.read_channel(3))
            except SandboxError:
                raise
            except Exception as e:  # noqa: BLE001 - the connection broke: the sandbox or its node died
                raise self._infra(f"exec stream broke: {e}") from None
            finally:
                try:
                    ws.close()
                except Exception:  # noqa: BLE001
                    pass
        e_text, e_cut = err.result()
        if out is not None:
            o_text, o_cut = out.result()
            return code, o_text, e_text, gave_up, o_cut or e_cut, time.monotonic() - t0
        return code, bytes(out_raw), e_text, gave_up, e_cut, time.monotonic() - t0

    def _exit_code(self, raw: bytes | str) -> int:
        try:
            st = json.loads(raw or b"{}")
        except ValueError:
            raise self._infra(f"exec ended without a status: {raw!r}") from None
        if st.get("status") == "Success":
            return 0
        for cause in (st.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                return int(cause["message"])
        raise self._infra(f"exec failed: {st.get('message') or st}")

    def _run(self, argv: list[str], timeout: float, user: str | None = None) -> tuple[int, str, str, bool, bool, float]:
        if user and user not in ("root", "0"):  # the exec API has no user field
            argv = ["su", "-s", "/bin/sh", "-c", shlex.join(argv), user]
        return self._stream(argv, timeout, limit=self.provider.config.max_output_bytes)

    # -- files ---------------------------------------------------------------------------
    def _run_checked(self, script: str, stdin: bytes | None = None, timeout: float = 300.0) -> bytes:
        code, out, err, gave_up, _, _ = self._stream(shell_argv(script), timeout, stdin=stdin)
        if gave_up:
            raise self._infra("file transfer timed out")
        if code == 2:
            raise FileNotFoundError(2, "No such file or directory", err.strip())
        if code != 0:
            raise self._infra(f"file transfer failed (exit {code}): {err.strip()[-300:]}")
        return out

    def _upload(self, script_tail: str, data: bytes) -> None:
        b64 = base64.b64encode(data)
        self._run_checked(f"head -c {len(b64)} | base64 -d {script_tail}", stdin=b64)

    def _write(self, path: str, data: bytes, mode: int) -> None:
        q = shlex.quote
        tmp = f"{path}.tinkrl-{uuid.uuid4().hex[:6]}"
        parent = os.path.dirname(path) or "/"
        self._run_checked(f"mkdir -p {q(parent)}")
        self._upload(f"> {q(tmp)} && chmod {mode & 0o7777:o} {q(tmp)} && mv -f {q(tmp)} {q(path)}", data)

    def _read(self, path: str) -> bytes:
        q = shlex.quote(path)
        out = self._run_checked(
            f"if [ -d {q} ]; then exit 21; fi; [ -f {q} ] || {{ echo {q} >&2; exit 2; }}; base64 {q}"
        )
        try:
            return base64.b64decode(out)
        except binascii.Error as e:
            raise self._infra(f"read of {path} returned bad data: {e}") from None

    def _put_tree(self, dest: str, tar: bytes) -> None:
        q = shlex.quote(dest)
        self._run_checked(f"mkdir -p {q}")
        self._upload(f"| tar xf - -C {q}", tar)

    def _get_tree(self, src: str) -> bytes:
        parent, name = os.path.split(src)
        q = shlex.quote
        out = self._run_checked(
            f"[ -e {q(src)} ] || {{ echo {q(src)} >&2; exit 2; }}; "
            f"cd {q(parent or '/')} && tar cf - {q(name or '.')} | base64"
        )
        return base64.b64decode(out)

    def _destroy(self) -> None:
        try:
            self.provider._delete_pod(self.api, self.name)
        finally:
            try:
                self.api.api_client.close()
            except Exception:  # noqa: BLE001
                pass


class KubernetesProvider(ContainerProvider):
    """Creates sandbox pods. Options: the fields of `KubernetesSandboxConfig`."""

    name = "kubernetes"
    config_class = KubernetesSandboxConfig
    config: KubernetesSandboxConfig

    def __init__(self, config: KubernetesSandboxConfig | dict[str, Any] | None = None, **options: Any):
        super().__init__(config, **options)
        _k8s()
        self._slots = threading.BoundedSemaphore(self.config.max_concurrent)
        if self.config.reap_on_start:
            for name, reason in reap_pods(self.config):
                self.notes.append(f"deleted leaked pod {name} ({reason})")

    def create(self, spec: SandboxSpec | None = None) -> KubernetesSandbox:
        self._check_open()
        spec = spec or SandboxSpec()
        image = self._image(spec)
        run_id = spec.labels.get("run_id") or self.run_id
        task = task_id_of(spec) or "sbx"
        name = f"tinkrl-{dns_name(run_id, 12)}-{dns_name(task, 24)}-{uuid.uuid4().hex[:6]}"
        self._slots.acquire()
        sb = None
        try:
            sb = KubernetesSandbox(self, spec, name)
            self._track(sb)
            sb._create(pod_manifest(self.config, spec, name, image, run_id, self.owner))
            sb._wait_ready()
            return sb
        except BaseException:
            if sb is not None:
                sb.close()  # deletes the pod (404 is fine) and frees the slot
            else:
                self._slots.release()
            raise

    def _delete_pod(self, api, name: str) -> None:
        delay = 0.5
        for attempt in range(4):
            try:
                api.delete_namespaced_pod(
                    name,
                    self.config.namespace,
                    grace_period_seconds=0,
                    propagation_policy="Background",
                    _request_timeout=self.config.request_timeout_s,
                )
                return
            except Exception as e:  # noqa: BLE001
                if _status_of(e) == 404:
                    return
                if attempt == 3:
                    # labels + expires-at let `tinkrl sandbox reap` collect it later
                    self.notes.append(f"could not delete pod {name}: {api_message(e)}")
                    return
                time.sleep(delay)
                delay *= 2

    def _forget(self, sb: KubernetesSandbox) -> bool:
        if forgotten := super()._forget(sb):
            self._slots.release()
        return forgotten


# -- the reaper ------------------------------------------------------------------------------
def leak_reason(pod, api, now: float | None = None) -> str | None:
    """Why a tinkrl sandbox pod is a leak, or None if its run is (or may be) alive."""
    now = time.time() if now is None else now
    ann = pod.metadata.annotations or {}
    try:
        if _parse_rfc3339(ann.get(f"{DOMAIN}/expires-at", "")) < now:
            return "expired"
    except ValueError:
        pass
    if ann.get(f"{DOMAIN}/owner-kind") == "pod":
        owner, ns = ann.get(f"{DOMAIN}/owner", ""), ann.get(f"{DOMAIN}/owner-namespace", "")
        try:
            opod = api.read_namespaced_pod(owner, ns)
        except Exception as e:  # noqa: BLE001
            if _status_of(e) == 404:
                return f"owner pod {owner} is gone"
            return None  # cannot tell (403, API trouble): never delete on doubt
        uid = ann.get(f"{DOMAIN}/owner-uid")
        if uid and opod.metadata.uid != uid:
            return f"owner pod {owner} was replaced"
        if opod.status and opod.status.phase in ("Succeeded", "Failed"):
            return f"owner pod {owner} finished"
        return None
    if Owner.recorded(ann, f"{DOMAIN}/").process_alive() is False:
        return "owner process is gone"
    return None


def reap_pods(
    cfg: KubernetesSandboxConfig, run_id: str | None = None, dry_run: bool = False, now: float | None = None
) -> list[tuple[str, str]]:
    """Delete leaked sandbox pods in cfg.namespace (or all of `run_id`'s); returns (name, reason)."""
    api = new_api(cfg)
    selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
    if run_id:
        selector += f",{DOMAIN}/run-id={label_value(run_id)}"
    try:
        pods = api.list_namespaced_pod(
            cfg.namespace, label_selector=selector, _request_timeout=cfg.request_timeout_s
        ).items
    except Exception as e:  # noqa: BLE001
        raise SandboxError(f"cannot list pods in {cfg.namespace}: {api_message(e)}", "sandbox_unavailable") from None
    done = []
    for pod in pods:
        reason = f"run {run_id}" if run_id else leak_reason(pod, api, now)
        if reason is None:
            continue
        if not dry_run:
            try:
                api.delete_namespaced_pod(pod.metadata.name, cfg.namespace, grace_period_seconds=0)
            except Exception as e:  # noqa: BLE001
                if _status_of(e) != 404:
                    reason += f" (delete failed: {api_message(e)})"
        done.append((pod.metadata.name, reason))
    api.api_client.close()
    return done

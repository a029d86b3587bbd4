"""A test Kubernetes API server for exactly the calls tinkrl's kubernetes provider makes.

No cluster runs on this machine, so this server follows the Kubernetes API's documented
behaviour for: pods create / read / list (label selectors) / delete in a namespace,
`metav1.Status` errors (404 NotFound, 409 AlreadyExists, 403 Forbidden, 422 Invalid),
bearer-token authentication, RBAC authorization from real Role/RoleBinding objects (the
ones the Helm chart renders), a one-node scheduler (nodeSelector, taints/tolerations,
CPU/memory requests; `PodScheduled=False, reason=Unschedulable` with the scheduler's
message), image pulls (unknown images go `ErrImagePull` then `ImagePullBackOff`), and the
exec subresource over WebSocket (`v5.channel.k8s.io`/`v4.channel.k8s.io`: channel-prefixed
frames, stdin close on v5, exit status on channel 3). With a podman engine, pods really run
as podman containers and exec really runs in them (`podman exec -i`); without one, pods
only reach Running and exec answers with a Status error.

For `tinkrl launch k8s` it also serves batch/v1 Jobs (create, read) with the Job controller's
part (a pod from the template per attempt, labelled `job-name`, the next one `job_backoff_s`
after a failure; `failed`/`succeeded` counts;
`Complete`, or `Failed` with `BackoffLimitExceeded` past `backoffLimit`), pod logs
(`pods/{name}/log`, `follow=true` as a chunked stream until the container ends), and reads of
ServiceAccounts and ConfigMaps added with `FakeKube.add` (e.g. the chart's rendered ones).
Pods whose image is in `host_images` run their container's command as a process on this
machine (in `host_workdir`, with the container's `env`; init containers are not run): their
output is the pod log and their exit code the container's `terminated.exitCode`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import struct
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from helpers.http_json import send_json

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def status(code: int, reason: str, message: str, **details: Any) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }


def _quantity(q: str | int | float | None) -> float:
    """CPU in cores or memory in bytes from a Kubernetes quantity string."""
    if q is None:
        return 0.0
    s = str(q)
    units = {"m": 1e-3, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "k": 1e3, "M": 1e6, "G": 1e9}
    for u in sorted(units, key=len, reverse=True):
        if s.endswith(u):
            return float(s[: -len(u)]) * units[u]
    return float(s)


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@dataclass
class Node:
    labels: dict[str, str] = field(default_factory=lambda: {"kubernetes.io/hostname": "fake-node"})
    taints: list[dict] = field(default_factory=list)
    cpu: float = 8.0
    memory: float = 32 * 1024**3


class Rbac:
    """RBAC authorizer over Role/ClusterRole + RoleBinding objects (subjects: ServiceAccount, User)."""

    def __init__(self, objects: list[dict]):
        self.roles = {
            (o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
            for o in objects
            if o["kind"] in ("Role", "ClusterRole")
        }
        self.bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]

    @staticmethod
    def _subject_is(subject: dict, user: str, binding_ns: str) -> bool:
        if subject["kind"] == "ServiceAccount":
            ns = subject.get("namespace") or binding_ns
            return user == f"system:serviceaccount:{ns}:{subject['name']}"
        return subject["kind"] == "User" and subject["name"] == user

    def allowed(self, user: str, verb: str, namespace: str, resource: str, name: str = "", group: str = "") -> bool:
        for b in self.bindings:
            bns = b["metadata"].get("namespace", "")
            if b["kind"] == "RoleBinding" and bns != namespace:
                continue
            if not any(self._subject_is(s, user, bns) for s in b.get("subjects", [])):
                continue
            ref = b["roleRef"]
            role = self.roles.get((bns if ref["kind"] == "Role" else "", ref["name"]))
            for rule in (role or {}).get("rules", []):
                if (
                    (group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
                    and (resource in rule.get("resources", []) or "*" in rule.get("resources", []))
                    and (verb in rule.get("verbs", []) or "*" in rule.get("verbs", []))
                    and (not rule.get("resourceNames") or name in rule["resourceNames"])
                ):
                    return True
        return False


class FakeKube:
    """The server's state: pods, one node, known images, tokens, and an optional podman backend."""

    def __init__(
        self,
        podman=None,
        images: dict[str, str] | None = None,
        node: Node | None = None,
        tokens: dict[str, str] | None = None,
        rbac: Rbac | None = None,
        pull_delay_s: float = 0.05,
        host_images: set[str] | None = None,
        host_workdir: Path | None = None,
        job_backoff_s: float = 1.0,
    ):
        self.podman = podman  # tests/podman_helper.Podman or None
        self.host_images = set(host_images or ())  # images whose pods run their command on this machine
        self.host_workdir = host_workdir
        self.job_backoff_s = job_backoff_s  # before a failed Job pod is replaced (real clusters: 10 s, doubling)
        self.jobs: dict[tuple[str, str], dict] = {}
        self.objects: dict[tuple[str, str, str], dict] = {}  # (resource, namespace, name) -> object
        self.images = dict(images or {})  # image as pods name it -> local podman image
        self.node = node or Node()
        self.tokens = dict(tokens or {"admin-token": "admin"})  # bearer token -> user
        self.rbac = rbac  # None: every authenticated user may do everything
        self.pull_delay_s = pull_delay_s
        self.pods: dict[tuple[str, str], dict] = {}
        self.created: list[dict] = []  # every pod as it was created (kept after deletion, for tests to read)
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str, str]] = []  # (user, verb, path) of every request
        self._stop = threading.Event()
        self._kubelet = threading.Thread(target=self._kubelet_loop, daemon=True)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self.httpd.daemon_threads = True
        self._serve = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeKube:
        self._kubelet.start()
        self._serve.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.lock:
            keys = list(self.pods)
        for ns, name in keys:
            self._remove_container(ns, name)

    def add(self, obj: dict) -> None:
        """Store a ServiceAccount or ConfigMap (e.g. one the Helm chart renders) for reads."""
        resource = {"ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps"}[obj["kind"]]
        md = obj["metadata"]
        self.objects[(resource, md.get("namespace", "default"), md["name"])] = obj

    def kubeconfig(self, path: Path, token: str = "admin-token", namespace: str = "default") -> Path:
        import yaml

        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "u", "user": {"token": token}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": namespace}}],
                }
            )
        )
        return path

    # -- scheduling and the kubelet --------------------------------------------------------
    def _unschedulable_reason(self, pod: dict) -> str | None:
        spec = pod["spec"]
        sel = spec.get("nodeSelector") or {}
        if any(self.node.labels.get(k) != v for k, v in sel.items()):
            return "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
        for taint in self.node.taints:
            if taint.get("effect") not in ("NoSchedule", "NoExecute"):
                continue
            tolerated = any(
                (t.get("operator") == "Exists" and t.get("key") in (None, taint["key"]))
                or (t.get("key") == taint["key"] and t.get("value") == taint.get("value"))
                for t in spec.get("tolerations") or []
            )
            if not tolerated:
                return (
                    f"0/1 nodes are available: 1 node(s) had untolerated taint "
                    f"{{{taint['key']}: {taint.get('value', '')}}}."
                )
        used_cpu = used_mem = 0.0
        for other in self.pods.values():
            if (
                other is not pod
                and other["spec"].get("nodeName")
                and other["status"]["phase"] in ("Pending", "Running")
            ):
                for c in other["spec"]["containers"]:
                    req = c.get("resources", {}).get("requests", {})
                    used_cpu += _quantity(req.get("cpu"))
                    used_mem += _quantity(req.get("memory"))
        for c in spec["containers"]:
            req = c.get("resources", {}).get("requests", {})
            if used_cpu + _quantity(req.get("cpu")) > self.node.cpu:
                return "0/1 nodes are available: 1 Insufficient cpu."
            if used_mem + _quantity(req.get("memory")) > self.node.memory:
                return "0/1 nodes are available: 1 Insufficient memory."
        return None

    def _kubelet_loop(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                pending = [(k, p) for k, p in self.pods.items() if p["status"]["phase"] == "Pending"]
            for key, pod in pending:
                self._advance(key, pod)
            with self.lock:
                for key, job in list(self.jobs.items()):
                    self._control(key, job)
            self._stop.wait(0.02)

    # -- the Job controller ------------------------------------------------------------------
    def _control(self, key: tuple[str, str], job: dict) -> None:
        """One pass of the Job controller over `job` (called with the lock held)."""
        st = job["status"]
        if any(c["status"] == "True" for c in st.get("conditions", [])):
            return
        pods = [p for (ns, _), p in self.pods.items() if ns == key[0] and p.get("_job") == key[1]]
        st["active"] = sum(p["status"]["phase"] in ("Pending", "Running") for p in pods)
        st["succeeded"] = sum(p["status"]["phase"] == "Succeeded" for p in pods)
        st["failed"] = sum(p["status"]["phase"] == "Failed" for p in pods)
        if st["succeeded"]:
            st["conditions"] = [_condition("Complete", "Completed")]
            st["completionTime"] = _now()
        elif st["failed"] > job["spec"].get("backoffLimit", 6):
            st["conditions"] = [_condition("Failed", "BackoffLimitExceeded")]
        elif not st["active"]:
            finished = [p["_finished"] for p in pods if "_finished" in p]
            if not finished or time.time() - max(finished) >= self.job_backoff_s:
                self._job_pod(key, job)

    def _job_pod(self, key: tuple[str, str], job: dict) -> None:
        template = json.loads(json.dumps(job["spec"]["template"]))
        uid = job["metadata"]["uid"]
        own = {"job-name": key[1], "batch.kubernetes.io/job-name": key[1], "controller-uid": uid}
        name = f"{key[1]}-{uuid.uuid4().hex[:5]}"
        metadata = template.get("metadata") or {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": key[0],
                "labels": {**(metadata.get("labels") or {}), **own},
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": key[1], "uid": uid}],
            },
            "spec": template["spec"],
            "status": {"phase": "Pending", "conditions": []},
            "_created": time.time(),
            "_job": key[1],
        }
        self.pods[(key[0], name)] = pod

    # -- containers run as processes on this machine ------------------------------------------
    def _run_on_host(self, key: tuple[str, str], pod: dict) -> None:
        c = pod["spec"]["containers"][0]
        fields = {"metadata.name": key[1], "metadata.namespace": key[0], "metadata.uid": pod["metadata"]["uid"]}
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            env[e["name"]] = fields.get(ref, "") if ref else str(e.get("value", ""))
        proc = subprocess.Popen(
            [*(c.get("command") or []), *(c.get("args") or [])],
            cwd=self.host_workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        pod["_log"], pod["_done"] = bytearray(), False
        started = _now()
        pod["status"].update(phase="Running", containerStatuses=[_running(c, started)])

        def reap() -> None:
            for chunk in iter(lambda: proc.stdout.read1(65536), b""):
                with self.lock:
                    pod["_log"] += chunk
            code = proc.wait()
            with self.lock:
                status = pod["status"]["containerStatuses"][0]
                status.update(ready=False, started=False)
                status["state"] = {
                    "terminated": {
                        "exitCode": code,
                        "startedAt": started,
                        "finishedAt": _now(),
                        "reason": "Completed" if code == 0 else "Error",
                    }
                }
                pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
                pod["_done"], pod["_finished"] = True, time.time()

        threading.Thread(target=reap, daemon=True).start()

    def _advance(self, key: tuple[str, str], pod: dict) -> None:
        st = pod["status"]
        if not pod["spec"].get("nodeName"):
            with self.lock:
                why = self._unschedulable_reason(pod)
                if why:
                    st["conditions"] = [
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
                    ]
                    return
                pod["spec"]["nodeName"] = "fake-node"
                st["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        c = pod["spec"]["containers"][0]
        age = time.time() - pod["_created"]
        if c["image"] in self.host_images:
            with self.lock:
                if key in self.pods and pod["status"]["phase"] == "Pending":
                    self._run_on_host(key, pod)
            return
        if c["image"] not in self.images:
            if age < self.pull_delay_s:
                return
            reason = "ErrImagePull" if age < 3 * self.pull_delay_s + 0.5 else "ImagePullBackOff"
            msg = (
                f'Back-off pulling image "{c["image"]}"'
                if reason == "ImagePullBackOff"
                else f'failed to pull and unpack image "{c["image"]}": not found'
            )
            st["containerStatuses"] = [_waiting(c, reason, msg)]
            return
        if self.podman is not None:
            res = self.podman.run(*self._run_args(key, pod), check=False)
            if res.returncode != 0:
                st["containerStatuses"] = [_waiting(c, "CreateContainerError", res.stderr.decode()[-300:])]
                st["phase"] = "Failed"
                return
        with self.lock:
            if key not in self.pods:  # deleted meanwhile
                self._remove_container(*key)
                return
            st["phase"] = "Running"
            st["conditions"] = [
                {"type": t, "status": "True"} for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ]
            st["containerStatuses"] = [_running(c, _now())]

    def _run_args(self, key: tuple[str, str], pod: dict) -> list[str]:
        c = pod["spec"]["containers"][0]
        limits = c.get("resources", {}).get("limits", {})
        args = ["run", "-d", "--name", _ctr(*key), "--network", "none", "--entrypoint", ""]
        if limits.get("memory"):
            args += ["--memory", str(int(_quantity(limits["memory"])))]
        if limits.get("cpu"):
            args += ["--cpus", f"{_quantity(limits['cpu']):.3f}"]
        if c.get("workingDir"):
            args += ["-w", c["workingDir"]]
        for e in c.get("env") or []:
            args += ["-e", f"{e['name']}={e.get('value', '')}"]
        return args + [self.images[c["image"]], *(c.get("command") or []), *(c.get("args") or [])]

    def _remove_container(self, ns: str, name: str) -> None:
        if self.podman is not None:
            self.podman.run("rm", "-f", "-t", "0", _ctr(ns, name), check=False)


def _ctr(ns: str, name: str) -> str:
    return f"k8s_{ns}_{name}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _condition(kind: str, reason: str) -> dict:
    return {"type": kind, "status": "True", "reason": reason, "lastProbeTime": _now(), "lastTransitionTime": _now()}


def _make_handler(kube: FakeKube):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        # -- plumbing ----------------------------------------------------------------------
        def _send(self, code: int, body: dict) -> None:
            send_json(self, code, body)

        def _user(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            return kube.tokens.get(auth[7:]) if auth.startswith("Bearer ") else None

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            parts = url.path.strip("/").split("/")
            user = self._user()
            if user is None:
                return self._send(401, status(401, "Unauthorized", "Unauthorized"))
            # /apis/batch/v1/namespaces/{ns}/jobs[/{name}]
            if len(parts) in (6, 7) and parts[:4] == ["apis", "batch", "v1", "namespaces"] and parts[5] == "jobs":
                return self._jobs(method, user, parts[4], parts[6] if len(parts) == 7 else "")
            # /api/v1/namespaces/{ns}/{serviceaccounts,configmaps}/{name}
            if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] in OBJECT_RESOURCES:
                return self._object(method, user, parts[4], parts[3], parts[5])
            # /api/v1/namespaces/{ns}/pods[/{name}[/exec|/log]]
            if len(parts) < 5 or parts[:3] != ["api", "v1", "namespaces"] or parts[4] != "pods":
                return self._send(404, status(404, "NotFound", "the server could not find the requested resource"))
            ns = parts[3]
            name = parts[5] if len(parts) > 5 else ""
            sub = parts[6] if len(parts) > 6 else ""
            resource = "pods/" + sub if sub else "pods"
            if sub == "exec":
                verb = "create"  # exec needs create on pods/exec (also over a WebSocket GET)
            else:
                verb = {
                    "GET": "get" if name else ("watch" if _flag(query, "watch") else "list"),
                    "POST": "create",
                    "DELETE": "delete",
                }.get(method, method.lower())
            if not self._allowed(user, verb, ns, resource, name, url.path):
                return None
            if sub == "exec":
                return self._exec(ns, name, query)
            if sub == "log":
                return self._log(ns, name, query)
            if sub:
                return self._send(404, status(404, "NotFound", "unsupported subresource"))
            if method == "POST" and not name:
                return self._create(ns)
            if method == "GET" and not name:
                sel = (query.get("labelSelector") or [""])[0]
                with kube.lock:
                    items = [
                        _public(p)
                        for (pns, _), p in kube.pods.items()
                        if pns == ns and _selector_matches(sel, p["metadata"].get("labels") or {})
                    ]
                return self._send(
                    200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}
                )
            with kube.lock:
                pod = kube.pods.get((ns, name))
                if pod is None:
                    return self._send(404, status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods"))
                if method == "GET":
                    return self._send(200, _public(pod))
                if method == "DELETE":
                    del kube.pods[(ns, name)]
            if method == "DELETE":
                kube._remove_container(ns, name)
                pod["metadata"]["deletionTimestamp"] = _now()
                return self._send(200, _public(pod))
            return self._send(405, status(405, "MethodNotAllowed", "method not allowed"))

        def _allowed(self, user: str, verb: str, ns: str, resource: str, name: str, path: str, group: str = "") -> bool:
            """Record the request; under RBAC, answer 403 (and return False) when the user may not."""
            kube.requests.append((user, verb, path))
            if kube.rbac is None or kube.rbac.allowed(user, verb, ns, resource, name, group):
                return True
            what = f'{resource} "{name}"' if name else resource
            self._send(
                403,
                status(
                    403,
                    "Forbidden",
                    f'{what} is forbidden: User "{user}" cannot {verb} resource '
                    f'"{resource}" in API group "{group}" in the namespace "{ns}"',
                    name=name,
                    kind=resource,
                ),
            )
            return False

        def _body(self) -> dict | None:
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                return None
            return body if isinstance(body, dict) else None

        # -- ServiceAccounts and ConfigMaps (read only), Jobs ------------------------------------
        def _object(self, method: str, user: str, resource: str, ns: str, name: str) -> None:
            if method != "GET":
                return self._send(405, status(405, "MethodNotAllowed", "method not allowed"))
            if not self._allowed(user, "get", ns, resource, name, self.path):
                return None
            obj = kube.objects.get((resource, ns, name))
            if obj is None:
                return self._send(
                    404, status(404, "NotFound", f'{resource} "{name}" not found', name=name, kind=resource)
                )
            self._send(200, obj)

        def _jobs(self, method: str, user: str, ns: str, name: str) -> None:
            verb = {"GET": "get" if name else "list", "POST": "create"}.get(method, method.lower())
            if not self._allowed(user, verb, ns, "jobs", name, self.path, group="batch"):
                return None
            if method == "POST" and not name:
                job = self._body()
                try:
                    job_name = job["metadata"]["name"]
                    pod = job["spec"]["template"]["spec"]
                    assert pod["containers"] and all(c.get("name") and c.get("image") for c in pod["containers"])
                    assert pod.get("restartPolicy") in ("Never", "OnFailure")
                except (TypeError, KeyError, AssertionError):
                    return self._send(
                        422,
                        status(
                            422,
                            "Invalid",
                            "Job is invalid: metadata.name, spec.template.spec.containers (name, image) are "
                            'required; spec.template.spec.restartPolicy: Unsupported value: "Never" or "OnFailure"',
                        ),
                    )
                with kube.lock:
                    if (ns, job_name) in kube.jobs:
                        return self._send(
                            409, status(409, "AlreadyExists", f'jobs.batch "{job_name}" already exists', name=job_name)
                        )
                    job["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
                    job["status"] = {"startTime": _now()}
                    kube.jobs[(ns, job_name)] = job
                return self._send(201, job)
            if method == "GET" and name:
                with kube.lock:
                    job = kube.jobs.get((ns, name))
                    body = json.loads(json.dumps(job)) if job else None
                if body is None:
                    return self._send(404, status(404, "NotFound", f'jobs.batch "{name}" not found', name=name))
                return self._send(200, body)
            self._send(405, status(405, "MethodNotAllowed", "method not allowed"))

        # -- pod logs ------------------------------------------------------------------------------
        def _log(self, ns: str, name: str, query: dict) -> None:
            with kube.lock:
                pod = kube.pods.get((ns, name))
            if pod is None:
                return self._send(404, status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods"))
            names = [c["name"] for c in pod["spec"]["containers"]]
            container = (query.get("container") or names[:1])[0]
            if container not in names:
                return self._send(400, status(400, "BadRequest", f"container {container} is not valid for pod {name}"))
            if "_log" not in pod:
                return self._send(
                    400, status(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start')
                )
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sent, follow = 0, _flag(query, "follow")
            while True:
                with kube.lock:
                    data, done = bytes(pod["_log"][sent:]), pod["_done"]
                if data:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                    sent += len(data)
                elif done or not follow:
                    break
                else:
                    time.sleep(0.02)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _create(self, ns: str) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            try:
                pod = json.loads(self.rfile.read(n) or b"{}")
                name = pod["metadata"]["name"]
                containers = pod["spec"]["containers"]
                assert containers and all(c.get("name") and c.get("image") for c in containers)
            except (ValueError, KeyError, TypeError, AssertionError):
                return self._send(
                    422,
                    status(422, "Invalid", "Pod is invalid: metadata.name, spec.containers (name, image) are required"),
                )
            if pod["metadata"].get("namespace", ns) != ns:
                return self._send(400, status(400, "BadRequest", "the namespace of the object does not match"))
            with kube.lock:
                if (ns, name) in kube.pods:
                    return self._send(
                        409, status(409, "AlreadyExists", f'pods "{name}" already exists', name=name, kind="pods")
                    )
                pod["metadata"].update(
                    namespace=ns,
                    uid=str(uuid.uuid4()),
                    creationTimestamp=_now(),
                    resourceVersion=str(len(kube.pods) + 1),
                )
                pod["status"] = {"phase": "Pending", "conditions": []}
                pod["_created"] = time.time()
                kube.pods[(ns, name)] = pod
                kube.created.append(json.loads(json.dumps(_public(pod))))
            self._send(201, _public(pod))

        # -- exec over WebSocket -------------------------------------------------------------
        def _exec(self, ns: str, name: str, query: dict) -> None:
            if self.headers.get("Upgrade", "").lower() != "websocket":
                return self._send(400, status(400, "BadRequest", "Upgrade request required"))
            offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
            proto = next((p for p in ("v5.channel.k8s.io", "v4.channel.k8s.io") if p in offered), None)
            if proto is None:
                return self._send(400, status(400, "BadRequest", "no supported channel protocol"))
            with kube.lock:
                pod = kube.pods.get((ns, name))
            if pod is None:
                return self._send(404, status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods"))
            key = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + WS_GUID).encode()).digest())
            self.send_response(101, "Switching Protocols")
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", key.decode())
            self.send_header("Sec-WebSocket-Protocol", proto)
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
            ws = _WebSocket(self.connection, self.rfile)
            command = query.get("command") or []
            if pod["status"]["phase"] != "Running" or kube.podman is None:
                ws.send_channel(
                    3, json.dumps(status(400, "BadRequest", "container not running or no runtime")).encode()
                )
                return ws.close()
            proc = subprocess.Popen(
                ["podman", "exec", "-i", _ctr(ns, name), *command],
                env=kube.podman.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            want_stdin = _flag(query, "stdin")  # Go's ParseBool: true, True, 1, ...
            if not want_stdin:
                proc.stdin.close()

            def pump(stream, channel):
                for chunk in iter(lambda: stream.read1(65536), b""):
                    ws.send_channel(channel, chunk)

            pumps = [
                threading.Thread(target=pump, args=(proc.stdout, 1), daemon=True),
                threading.Thread(target=pump, args=(proc.stderr, 2), daemon=True),
            ]
            for t in pumps:
                t.start()

            def feed():
                while True:
                    msg = ws.recv()
                    if msg is None:  # client went away: like a dropped stream, kill the exec
                        proc.kill()
                        return
                    if not msg:
                        continue
                    if msg[0] == 0 and want_stdin and not proc.stdin.closed:
                        try:
                            proc.stdin.write(msg[1:])
                            proc.stdin.flush()
                        except (BrokenPipeError, ValueError):
                            pass
                    elif msg[0] == 255 and proto.startswith("v5") and msg[1:2] == b"\x00" and not proc.stdin.closed:
                        proc.stdin.close()

            threading.Thread(target=feed, daemon=True).start()
            code = proc.wait()
            for t in pumps:
                t.join()
            if code == 0:
                st = {"metadata": {}, "status": "Success"}
            else:
                st = status(500, "NonZeroExitCode", f"command terminated with non-zero exit code: {code}")
                st["details"] = {"causes": [{"reason": "ExitCode", "message": str(code)}]}
            ws.send_channel(3, json.dumps(st).encode())
            ws.close()

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def do_DELETE(self):
            self._route("DELETE")

    return Handler


OBJECT_RESOURCES = ("serviceaccounts", "configmaps")


def _flag(query: dict, key: str) -> bool:
    return (query.get(key) or [""])[0] in ("1", "t", "T", "true", "TRUE", "True")


def _public(pod: dict) -> dict:
    return {k: v for k, v in pod.items() if not k.startswith("_")}


class _WebSocket:
    """Server side of RFC 6455: unmasked frames out, masked frames in."""

    def __init__(self, sock: socket.socket, rfile):
        self.sock = sock
        self.rfile = rfile
        self.wlock = threading.Lock()
        self.closed = False

    def send_channel(self, channel: int, data: bytes) -> None:
        self._send_frame(0x2, bytes([channel]) + data)

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([n])
        elif n < 65536:
            head += bytes([126]) + struct.pack(">H", n)
        else:
            head += bytes([127]) + struct.pack(">Q", n)
        with self.wlock:
            if self.closed:
                return
            try:
                self.sock.sendall(head + payload)
            except OSError:
                self.closed = True

    def recv(self) -> bytes | None:
        """The next data message (fragments joined), or None when the connection ends."""
        data = b""
        while True:
            try:
                h = self.rfile.read(2)
                if len(h) < 2:
                    return None
                fin, opcode, masked, n = h[0] & 0x80, h[0] & 0x0F, h[1] & 0x80, h[1] & 0x7F
                if n == 126:
                    n = struct.unpack(">H", self.rfile.read(2))[0]
                elif n == 127:
                    n = struct.unpack(">Q", self.rfile.read(8))[0]
                mask = self.rfile.read(4) if masked else b"\0\0\0\0"
                raw = self.rfile.read(n)
            except (OSError, struct.error):
                return None
            full_mask = (mask * (n // 4 + 1))[:n]
            payload = (int.from_bytes(raw, "big") ^ int.from_bytes(full_mask, "big")).to_bytes(n, "big")
            if opcode == 0x8:
                return None
            if opcode in (0x9, 0xA):
                if opcode == 0x9:
                    self._send_frame(0xA, payload)
                continue
            data += payload
            if fin:
                return data

    def close(self) -> None:
        self._send_frame(0x8, struct.pack(">H", 1000))
        with self.wlock:
            self.closed = True


def _running(container: dict, started: str) -> dict:
    """A container status that is running since `started`, as the kubelet reports it."""
    return {
        "name": container["name"],
        "ready": True,
        "started": True,
        "restartCount": 0,
        "imageID": "",
        "image": container["image"],
        "state": {"running": {"startedAt": started}},
    }


def _waiting(container: dict, reason: str, message: str) -> dict:
    """A container status that is waiting (not started) for `reason`, as the kubelet reports it."""
    return {
        "name": container["name"],
        "ready": False,
        "restartCount": 0,
        "imageID": "",
        "image": container["image"],
        "state": {"waiting": {"reason": reason, "message": message}},
    }

"""Kubernetes: one batch/v1 Job that runs a command in the tinkrl image, next to the Helm chart's
release (`deploy/helm/tinkrl`), through the official `kubernetes` client.

One config with the cluster path: everything cluster-specific comes from the chart's values (its
`values.yaml` and the values files the release was installed with, as `make -C deploy VALUES=...`):
the image repository (tagged with the short commit, as `make -C deploy push` tags it), the release's
ServiceAccount (whose Role covers the sandbox pods), the Secret of API keys (`envFrom`, by
reference), image pull secrets and system node placement, and the run config ConfigMap that
`tinkrl train` reads through `$TINKRL_CONFIG` when given no config file (`tinkrl.config.load_config`).

The run directory is /results: with `results.s3Uri` in the values it is pulled back from
`<s3Uri>/<job>` before the command starts and pushed there by a sidecar (the training preset's
sync, `tinkrl.storage`), or it is a sub-directory of an existing claim (`pvc=`); so when a pod fails
and the Job starts another (`backoffLimit`), the run resumes from its checkpoints.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from tinkrl.config import merge_mapping
from tinkrl.errors import ConfigError
from tinkrl.launch.common import RESULTS_DIR, GitState, describe, option
from tinkrl.sandbox.kubernetes import api_message

CHART = "deploy/helm/tinkrl"
CONFIG_DIR = "/etc/tinkrl"  # where the chart's run config ConfigMap is mounted (as in the orchestrator)
MAIN = "main"  # the Job's container that runs the command
FINAL = ("Complete", "Failed")


@dataclass
class JobOptions:
    """The keys of `tinkrl launch k8s`."""

    namespace: str = option("tinkrl", "namespace of the chart's release (make -C deploy's NAMESPACE)")
    release: str = option("tinkrl", "the chart's release name (make -C deploy's RELEASE)")
    values: list[str] = option([], "values files the release was installed with, comma-separated (as VALUES=)")
    image: str | None = option(None, "image (default: the values' image.repository at the short commit)")
    follow: bool = option(False, "stream the Job's logs until it ends, then exit with its exit code")
    allow_dirty: bool = option(False, "launch although the checkout has uncommitted changes")
    name: str | None = option(None, "Job name (default: tinkrl-<commit>-<UTC time>)")
    gpus: int = option(0, "GPUs for the container (nvidia.com/gpu)")
    retries: int = option(3, "new pods after a failed one before the Job fails (backoffLimit)")
    pvc: str | None = option(None, "an existing PersistentVolumeClaim for /results (one sub-directory per Job)")
    kubeconfig: str | None = option(None, "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    context: str | None = option(None, "kubeconfig context (default: its current one)")


@dataclass(frozen=True)
class ChartSettings:
    """What the Job takes from the chart's values, named as the chart's templates name them."""

    values: dict[str, Any]
    release: str

    @property
    def fullname(self) -> str:
        """`tinkrl.fullname`: the release name cut to 50 characters, less one trailing dash (trimSuffix)."""
        name = self.release[:50]
        return name[:-1] if name.endswith("-") else name

    @property
    def service_account(self) -> str:
        """`tinkrl.serviceAccountName`."""
        return self.values["serviceAccount"].get("name") or f"{self.fullname}-orchestrator"

    @property
    def config_map(self) -> str:
        """The run config ConfigMap (`templates/configmap.yaml`)."""
        return f"{self.fullname}-config"

    def image(self, git: GitState, override: str | None) -> str:
        """`override` (a name without a tag gets the short commit), else image.repository:<short commit>."""
        image = override or self.values["image"]["repository"]
        last = image.rsplit("/", 1)[-1]
        return image if (":" in last or "@" in image) else f"{image}:{git.short}"

    def s3_env(self) -> list[dict[str, str]]:
        """`tinkrl.s3Env`."""
        results = self.values["results"]
        return [
            {"name": "TINKRL_S3_ENDPOINT_URL", "value": str(results.get("endpointUrl") or "")},
            {"name": "AWS_DEFAULT_REGION", "value": str(results.get("region") or "us-east-1")},
        ]


def chart_settings(git: GitState, release: str, values_files: list[str]) -> ChartSettings:
    """The chart's values.yaml with the given values files merged over it (each found as given, else in
    deploy/ as the Makefile's VALUES are)."""
    defaults = git.root / CHART / "values.yaml"
    if not defaults.is_file():
        raise ConfigError(f"no Helm chart at {defaults.parent}: run tinkrl launch k8s in a tinkrl checkout")
    values = yaml.safe_load(defaults.read_text())
    for name in values_files:
        path = next((p for p in (Path(name), git.root / "deploy" / name) if p.is_file()), None)
        if path is None:
            raise ConfigError(f"values file {name} not found (looked in . and {git.root / 'deploy'})")
        merge_mapping(values, yaml.safe_load(path.read_text()) or {})
    return ChartSettings(values, release)


def _container_env(git: GitState) -> list[dict[str, Any]]:
    downward = [("POD_NAME", "metadata.name"), ("POD_UID", "metadata.uid"), ("POD_NAMESPACE", "metadata.namespace")]
    env: list[dict[str, Any]] = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in downward
    ]  # the sandbox owner identity the reaper checks, as in the orchestrator
    env.append({"name": "TINKRL_CONFIG", "value": f"{CONFIG_DIR}/config.yaml"})
    env.append({"name": "TINKRL_GIT_COMMIT", "value": git.commit})
    return env


def _sync_containers(chart: ChartSettings, image: str, name: str) -> list[dict[str, Any]]:
    """The restore init container and the push sidecar (a native sidecar: it ends with the Job)."""
    results = chart.values["results"]
    if not results.get("s3Uri"):
        return []
    uri = f"{results['s3Uri'].rstrip('/')}/{name}"
    base = {
        "image": image,
        "imagePullPolicy": chart.values["image"]["pullPolicy"],
        "envFrom": [_secret_ref(chart)],
        "env": chart.s3_env(),
        "volumeMounts": [{"name": "results", "mountPath": RESULTS_DIR}],
    }
    out = []
    if results.get("restoreOnStart", True):
        pull = ["python", "-m", "tinkrl.storage", "pull", uri, RESULTS_DIR]
        out.append({"name": "restore-results", **base, "command": pull})
    every = str(results.get("syncIntervalSeconds", 60))
    push = ["python", "-m", "tinkrl.storage", "push", RESULTS_DIR, uri, "--every", every]
    sidecar = {"name": "sync-results", **base, "command": push, "restartPolicy": "Always"}
    sidecar["resources"] = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    return out + [sidecar]


def _secret_ref(chart: ChartSettings) -> dict[str, Any]:
    secrets = chart.values["secrets"]
    return {"secretRef": {"name": secrets["name"], "optional": bool(secrets.get("optional", True))}}


def job_manifest(
    opts: JobOptions, chart: ChartSettings, command: list[str], git: GitState, name: str
) -> dict[str, Any]:
    """The batch/v1 Job (a plain dict, as the API takes it)."""
    image = chart.image(git, opts.image)
    values = chart.values
    labels = {
        "app.kubernetes.io/name": "tinkrl",
        "app.kubernetes.io/instance": opts.release,
        "app.kubernetes.io/component": "launch",
        "tinkrl.dev/commit": git.short,
    }
    resources = yaml.safe_load(yaml.safe_dump(values["orchestrator"]["resources"]))  # a copy
    if opts.gpus:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = opts.gpus
    mount = {"name": "results", "mountPath": RESULTS_DIR, **({"subPath": name} if opts.pvc else {})}
    main = {
        "name": MAIN,
        "image": image,
        "imagePullPolicy": values["image"]["pullPolicy"],
        "command": list(command),
        "envFrom": [_secret_ref(chart)],
        "env": _container_env(git),
        "resources": resources,
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}, mount],
    }
    volume = {"persistentVolumeClaim": {"claimName": opts.pvc}} if opts.pvc else {"emptyDir": {}}
    pod: dict[str, Any] = {
        "serviceAccountName": chart.service_account,
        "restartPolicy": "Never",  # a failed pod is replaced by a new one (backoffLimit), which resumes the run
        "containers": [main],
        "volumes": [{"name": "config", "configMap": {"name": chart.config_map}}, {"name": "results", **volume}],
    }
    if values.get("imagePullSecrets"):
        pod["imagePullSecrets"] = [{"name": s} for s in values["imagePullSecrets"]]
    system = values["nodeGroups"]["system"]
    if system.get("nodeSelector"):
        pod["nodeSelector"] = system["nodeSelector"]
    if system.get("tolerations"):
        pod["tolerations"] = system["tolerations"]
    init = [] if opts.pvc else _sync_containers(chart, image, name)
    if init:
        pod["initContainers"] = init
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": opts.namespace,
            "labels": labels,
            "annotations": {"tinkrl.dev/commit": git.commit, "tinkrl.dev/command": describe(git, command)},
        },
        "spec": {"backoffLimit": opts.retries, "template": {"metadata": {"labels": labels}, "spec": pod}},
    }


def keeps_results(manifest: dict[str, Any]) -> bool:
    """Whether the Job's /results outlives a pod (a claim, or the S3 sync)."""
    pod = manifest["spec"]["template"]["spec"]
    return any("persistentVolumeClaim" in v for v in pod["volumes"]) or bool(pod.get("initContainers"))


# -- talking to the cluster -------------------------------------------------------------------


def connect(opts: JobOptions) -> tuple[Any, Any]:
    """(BatchV1Api, CoreV1Api) on one ApiClient from the kubeconfig (or in-cluster credentials)."""
    from tinkrl.errors import TinkrlError
    from tinkrl.sandbox.kubernetes import api_client

    try:
        api = api_client(opts.kubeconfig, opts.context)
    except TinkrlError as e:
        raise ConfigError(str(e)) from None
    from kubernetes import client

    return client.BatchV1Api(api), client.CoreV1Api(api)


def check_release(core: Any, chart: ChartSettings, namespace: str) -> None:
    """The release's ServiceAccount and run config exist in the namespace (else one line saying to
    install the chart)."""
    from kubernetes.client.exceptions import ApiException

    for kind, name, read in (
        ("ServiceAccount", chart.service_account, core.read_namespaced_service_account),
        ("ConfigMap", chart.config_map, core.read_namespaced_config_map),
    ):
        try:
            read(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise ConfigError(f"cannot read {kind} {name} in {namespace}: {api_message(e)}") from None
            raise ConfigError(
                f"no {kind} {name} in namespace {namespace}: install the chart first (make -C deploy deploy), "
                "or set release= / namespace= / values= to the installed one"
            ) from None


def submit(batch: Any, manifest: dict[str, Any]) -> None:
    """Create the Job; a refusal (name taken, forbidden, invalid) is one line."""
    from kubernetes.client.exceptions import ApiException

    try:
        batch.create_namespaced_job(manifest["metadata"]["namespace"], manifest)
    except ApiException as e:
        raise ConfigError(f"Kubernetes refused the Job: {api_message(e)}") from None


def _job_pods(core: Any, namespace: str, name: str) -> list[Any]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
    return sorted(pods, key=lambda p: p.metadata.creation_timestamp)  # a replacement comes after a back-off


def _main_exit_code(pod: Any) -> int | None:
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.name == MAIN and status.state and status.state.terminated:
            return int(status.state.terminated.exit_code)
    return None


def _stream_logs(core: Any, namespace: str, pod: str, out: IO[str]) -> None:
    resp = core.read_namespaced_pod_log(pod, namespace, container=MAIN, follow=True, _preload_content=False)
    try:
        for chunk in resp.stream(4096):
            out.write(chunk.decode("utf-8", errors="replace"))
            out.flush()
    finally:
        resp.release_conn()


def _say_why_waiting(pod: Any, said: set[tuple[str, str]], out: IO[str]) -> None:
    """Print, once per pod and reason, why a pending pod is not running (unschedulable, image pull)."""
    reasons = [
        (c.reason, c.message)
        for c in pod.status.conditions or []
        if c.type == "PodScheduled" and c.status == "False" and c.reason
    ]
    for status in pod.status.container_statuses or []:
        waiting = status.state.waiting if status.state else None
        if waiting and waiting.reason not in (None, "ContainerCreating", "PodInitializing"):
            reasons.append((waiting.reason, waiting.message))
    for reason, message in reasons:
        if (pod.metadata.name, reason) not in said:
            said.add((pod.metadata.name, reason))
            out.write(f"tinkrl launch: pod {pod.metadata.name} is waiting: {reason}: {message or ''}\n")
            out.flush()


def follow(batch: Any, core: Any, namespace: str, name: str, out: IO[str], poll_s: float = 1.0) -> int:
    """Stream the logs of each of the Job's pods in turn (a retry is a new pod) until the Job completes
    or fails; returns 0, or the last pod's exit code (1 when it has none)."""
    followed: set[str] = set()
    said: set[tuple[str, str]] = set()
    while True:
        # read the Job first: once it is final, the pods listed after it are all of its pods
        conditions = batch.read_namespaced_job(name, namespace).status.conditions or []
        done = {c.type for c in conditions if c.type in FINAL and c.status == "True"}
        pods = _job_pods(core, namespace, name)
        for pod in pods:
            if pod.metadata.name in followed:
                continue
            if pod.status.phase == "Pending":
                _say_why_waiting(pod, said, out)
                continue
            followed.add(pod.metadata.name)
            _stream_logs(core, namespace, pod.metadata.name, out)
        if "Complete" in done:
            return 0
        if "Failed" in done:
            codes = [c for c in map(_main_exit_code, _job_pods(core, namespace, name)) if c is not None]
            return codes[-1] if codes and codes[-1] else 1
        time.sleep(poll_s)


def warn_ephemeral(manifest: dict[str, Any], log: IO[str] | None = None) -> None:
    """Say so when /results dies with its pod (no S3 sync in the values, no pvc=)."""
    if not keeps_results(manifest):
        print(
            "tinkrl launch: /results is an emptyDir (no results.s3Uri in the values, no pvc=): "
            "a replacement pod starts the run over",
            file=log or sys.stderr,
        )

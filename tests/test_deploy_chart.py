"""The Helm chart, rendered and linted by Helm's own Go library (helm-python-sdk embeds it),
every manifest validated against the Kubernetes OpenAPI schemas (kubernetes-validate), and
the RBAC it grants: pods and pods/exec in the sandbox namespace, nothing else — checked
both by reading the Role and by enforcing it in the test API server while the real
provider creates, execs in and deletes pods.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "deploy"))
sys.path.insert(0, str(Path(__file__).parent))

helm = pytest.importorskip("helm_python", reason="helm-python-sdk not installed (pip install -e '.[dev]')")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

import render  # noqa: E402  deploy/render.py

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
        ["make", "-s", "-C", "deploy", "template", "VALUES=values-training.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {"Role", "RoleBinding", "Deployment", "ConfigMap", "ServiceAccount"} <= {d["kind"] for d in docs}
    lint = subprocess.run(["make", "-s", "-C", "deploy", "lint"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr


def test_eksctl_config_has_a_tainted_autoscaled_sandbox_group_matching_the_chart():
    cfg = yaml.safe_load((ROOT / "deploy" / "eksctl-cluster.yaml").read_text())
    groups = {g["name"]: g for g in cfg["managedNodeGroups"]}
    values = yaml.safe_load((render.CHART / "values.yaml").read_text())
    sandbox, system = groups["sandbox"], groups["system"]
    assert sandbox["minSize"] == 0 and sandbox["maxSize"] > 0
    assert sandbox["labels"] == values["nodeGroups"]["sandbox"]["nodeSelector"]
    assert system["labels"] == values["nodeGroups"]["system"]["nodeSelector"]
    taint = sandbox["taints"][0]
    tol = values["nodeGroups"]["sandbox"]["tolerations"][0]
    assert (taint["key"], taint["effect"]) == (tol["key"], tol["effect"])
    assert sandbox["tags"]["k8s.io/cluster-autoscaler/enabled"] == "true"


def test_dockerfile_has_the_entrypoint_and_the_r2egym_pin():
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "ARG R2EGYM_REF" in text and "R2E-Gym@${R2EGYM_REF}" in text
    assert 'ENTRYPOINT ["tini", "--", "tinkrl"]' in text
    assert '".[cluster]"' in text

"""`tinkrl launch k8s`: a Kubernetes Job next to the Helm chart's release.

The Job takes what it shares with the cluster path from the chart's values, and the test holds it
to the chart Helm itself renders for the same values (helm-python-sdk embeds Helm's Go library):
image repository, ServiceAccount, Secret, pull secrets, placement, run config ConfigMap, S3 sync.
The manifest is validated against the Kubernetes OpenAPI schemas. Submission and `follow=true` run
the official kubernetes client against tests/helpers/k8s_fake_server.py, whose Job controller starts
a pod per attempt and runs its command as a process here (the pod log is its output).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml
from helpers.git_repo import checkout, git

from tinkrl.cli import main as tinkrl

pytest.importorskip("kubernetes", reason="kubernetes client not installed (pip install -e '.[dev]')")
helm = pytest.importorskip("helm_python", reason="helm-python-sdk not installed (pip install -e '.[dev]')")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
from helpers import k8s_fake_server as kf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "deploy"))
import render  # noqa: E402  deploy/render.py

VALUES = {  # what a user's values file for an EKS install sets
    "image": {"repository": "123456789012.dkr.ecr.us-west-2.amazonaws.com/tinkrl"},
    "imagePullSecrets": ["regcred"],
    "secrets": {"name": "team-keys", "optional": False},
    "results": {"s3Uri": "s3://tinkrl-bucket/runs", "region": "us-west-2", "syncIntervalSeconds": 30},
    "sandbox": {"image": "ubuntu:24.04", "maxConcurrent": 32},
}


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A clean checkout holding the chart (deploy/), as the working directory."""
    path = tmp_path / "repo"
    shutil.copytree(ROOT / "deploy", path / "deploy", ignore=shutil.ignore_patterns(".env"))
    checkout(path, {"README.md": "a checkout\n"})
    monkeypatch.chdir(path)
    return path


def chart_docs(values_files: list[Path], release: str = "tinkrl", namespace: str = "tinkrl") -> dict[str, dict]:
    """The chart as Helm renders it for these values files: {kind/name: manifest}."""
    values = render.user_values([str(f) for f in values_files], [])
    docs = [d for d in yaml.safe_load_all(render.render(values, release=release, namespace=namespace)) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def dry_run(capsys, *keys: str, command: tuple[str, ...] = ("tinkrl", "train", "model_name=Qwen/Qwen3-8B")) -> dict:
    rc = tinkrl(["launch", "k8s", *keys, "--dry-run", "--", *command])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return yaml.safe_load(out)


def test_the_job_is_valid_kubernetes_and_takes_the_charts_settings(repo, capsys, tmp_path):
    values = tmp_path / "eks.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    job = dry_run(capsys, f"values=values-training.yaml,{values}", "name=erdos-ttt", "gpus=1")
    kubernetes_validate.validate(job, "1.31", strict=True)  # raises on any schema error
    chart = chart_docs([ROOT / "deploy" / "values-training.yaml", values])
    orch = chart["Deployment/tinkrl-orchestrator"]["spec"]["template"]["spec"]
    pod = job["spec"]["template"]["spec"]
    [main] = pod["containers"]
    short = git(repo, "rev-parse", "--short", "HEAD")

    assert job["metadata"] == {**job["metadata"], "name": "erdos-ttt", "namespace": "tinkrl"}
    assert job["spec"]["backoffLimit"] == 3 and pod["restartPolicy"] == "Never"
    assert main["command"] == ["tinkrl", "train", "model_name=Qwen/Qwen3-8B"]  # the command, word for word
    # one config with the cluster path: what the chart gives its orchestrator, the Job gets
    assert main["image"] == f"{VALUES['image']['repository']}:{short}"  # as `make -C deploy push` tags it
    assert orch["containers"][0]["image"].rsplit(":", 1)[0] == main["image"].rsplit(":", 1)[0]
    assert pod["serviceAccountName"] == orch["serviceAccountName"] == "tinkrl-orchestrator"
    assert (
        main["envFrom"] == orch["containers"][0]["envFrom"] == [{"secretRef": {"name": "team-keys", "optional": False}}]
    )
    assert pod["imagePullSecrets"] == orch["imagePullSecrets"] and pod["nodeSelector"] == orch["nodeSelector"]
    config_volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"] in {n.split("/")[1] for n in chart if n.startswith("ConfigMap/")}
    assert {"name": "TINKRL_CONFIG", "value": "/etc/tinkrl/config.yaml"} in main["env"]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 1
    # /results survives a pod: pulled back from S3 first, pushed by a sidecar that ends with the Job
    restore, sync = pod["initContainers"]
    chart_sync = next(c for c in orch["containers"] if c["name"] == "sync-results")
    assert restore["command"] == [
        "python",
        "-m",
        "tinkrl.storage",
        "pull",
        "s3://tinkrl-bucket/runs/erdos-ttt",
        "/results",
    ]
    assert sync["command"] == [
        "python",
        "-m",
        "tinkrl.storage",
        "push",
        "/results",
        "s3://tinkrl-bucket/runs/erdos-ttt",
    ] + [
        "--every",
        "30",
    ]
    assert sync["restartPolicy"] == "Always" and sync["env"] == chart_sync["env"]
    assert {"name": "results", "mountPath": "/results"} in main["volumeMounts"]


def test_a_claim_instead_of_s3_and_an_emptydir_warns(repo, capsys):
    job = dry_run(capsys, "pvc=runs-claim", "name=j1", "retries=0", "image=reg/tinkrl:v1")
    pod = job["spec"]["template"]["spec"]
    assert {"name": "results", "persistentVolumeClaim": {"claimName": "runs-claim"}} in pod["volumes"]
    assert {"name": "results", "mountPath": "/results", "subPath": "j1"} in pod["containers"][0]["volumeMounts"]
    assert "initContainers" not in pod and job["spec"]["backoffLimit"] == 0
    assert pod["containers"][0]["image"] == "reg/tinkrl:v1"
    rc = tinkrl(["launch", "k8s", "--dry-run", "--", "true"])
    assert rc == 0 and "a replacement pod starts the run over" in capsys.readouterr().err


def test_the_clusters_sandbox_settings_reach_tinkrl_train(tmp_path, monkeypatch):
    """The Job (and the orchestrator) mount the chart's run config; `tinkrl train` without a config file
    reads it, and the command line still wins."""
    from tinkrl.config import load_config

    values = tmp_path / "eks.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    config = yaml.safe_load(chart_docs([values])["ConfigMap/tinkrl-config"]["data"]["config.yaml"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("TINKRL_CONFIG", str(path))
    seed = ["model_name=Qwen/Qwen3-8B", "num_batches=5", "minitb.dataset_path=/data/tasks", "log_path=/results"]
    cfg = load_config(None, seed + ["sandbox.kubernetes.max_concurrent=5"])
    assert cfg.dialect == "tinking" and cfg.log_path == "/results"  # the run's own keys, as written
    assert cfg.sandbox.provider == "kubernetes" and cfg.sandbox.kubernetes.image == "ubuntu:24.04"
    assert cfg.sandbox.kubernetes.namespace == "tinkrl" and cfg.sandbox.kubernetes.max_concurrent == 5
    other = tmp_path / "mine.yaml"
    other.write_text("env: arithmetic\n")
    assert load_config(str(other), []).sandbox.provider == "bwrap"  # a config file of its own: nothing added


# -- against the test API server --------------------------------------------------------------

ATTEMPTS = """
import os, pathlib, sys
marker = pathlib.Path("attempts")
n = int(marker.read_text()) + 1 if marker.exists() else 1
marker.write_text(str(n))
print(f"attempt {n} in {os.environ['POD_NAME']}", flush=True)
print("config", os.environ["TINKRL_CONFIG"])
sys.exit(0 if n >= int(sys.argv[1]) else 3)
"""


@pytest.fixture
def kube(repo, tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    short = git(repo, "rev-parse", "--short", "HEAD")
    system = kf.Node(labels={"kubernetes.io/hostname": "fake-node", "tinkrl.dev/pool": "system"})  # eksctl's label
    k = kf.FakeKube(host_images={f"tinkrl:{short}"}, host_workdir=node, node=system).start()
    k.kc = str(k.kubeconfig(tmp_path / "kubeconfig"))
    k.node_dir = node
    yield k
    k.stop()


def install_chart(kube) -> None:
    """What `make -C deploy deploy` leaves that the Job uses: the chart's ServiceAccount and ConfigMap."""
    for name, doc in chart_docs([]).items():
        if name.split("/")[0] in ("ServiceAccount", "ConfigMap"):
            kube.add(doc)


def launch(capsys, kube, *keys: str, command: list[str]) -> tuple[int, str, str]:
    rc = tinkrl(["launch", "k8s", f"kubeconfig={kube.kc}", *keys, "--", *command])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_failed_pod_is_replaced_and_follow_streams_both_to_the_jobs_end(repo, kube, capsys):
    install_chart(kube)
    command = [sys.executable, "-c", ATTEMPTS, "2"]
    rc, out, err = launch(capsys, kube, "follow=true", "name=erdos-ttt", command=command)
    assert rc == 0, err
    job = kube.jobs[("tinkrl", "erdos-ttt")]
    pod = job["spec"]["template"]["spec"]
    [main] = pod["containers"]
    short = git(repo, "rev-parse", "--short", "HEAD")
    assert main["image"] == f"tinkrl:{short}" and main["command"] == command
    assert main["envFrom"] == [{"secretRef": {"name": "tinkrl-env", "optional": True}}]  # the chart's Secret
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "tinkrl-orchestrator"
    assert job["spec"]["backoffLimit"] == 3 and job["status"]["conditions"][0]["type"] == "Complete"
    pods = sorted(p["metadata"]["name"] for p in kube.pods.values())
    assert len(pods) == 2 and all(p.startswith("erdos-ttt-") for p in pods)
    lines = out.splitlines()
    assert lines[0] == "job/erdos-ttt created in namespace tinkrl"
    attempts = [line for line in lines if line.startswith("attempt ")]
    assert [a.split(" in ")[0] for a in attempts] == ["attempt 1", "attempt 2"]  # both pods' logs, in order
    assert {a.split(" in ")[1] for a in attempts} == set(pods)  # each pod knows its name (downward API)
    assert "config /etc/tinkrl/config.yaml" in lines


def test_follow_exits_with_the_last_pods_code_when_retries_run_out(repo, kube, capsys):
    install_chart(kube)
    rc, out, _ = launch(
        capsys, kube, "follow=true", "retries=0", "name=j2", command=[sys.executable, "-c", ATTEMPTS, "9"]
    )
    assert rc == 3 and "attempt 1" in out
    assert kube.jobs[("tinkrl", "j2")]["status"]["conditions"][0]["reason"] == "BackoffLimitExceeded"
    assert len(kube.pods) == 1


def test_without_the_release_or_with_a_taken_name_nothing_is_created(repo, kube, capsys):
    rc, _, err = launch(capsys, kube, "name=j3", command=["true"])
    assert rc == 2 and "no ServiceAccount tinkrl-orchestrator in namespace tinkrl: install the chart first" in err
    assert kube.jobs == {}
    install_chart(kube)
    rc, out, _ = launch(capsys, kube, "name=j3", command=["true"])
    assert rc == 0 and out.strip() == "job/j3 created in namespace tinkrl"  # follow=false: back at once
    rc, _, err = launch(capsys, kube, "name=j3", command=["true"])
    assert rc == 2 and 'Kubernetes refused the Job: jobs.batch "j3" already exists' in err
    rc, _, err = launch(capsys, kube, "name=Not_A_Name", command=["true"])
    assert rc == 2 and "name=Not_A_Name: not a valid Kubernetes Job (DNS label) name" in err

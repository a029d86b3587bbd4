"""`helm template` / `helm lint` without a helm binary: Helm's own Go library, embedded in
the helm-python-sdk wheel, renders and lints the chart (used by `make template`/`make lint`
when `helm` is not on PATH).

    python deploy/render.py template [-f VALUES.yaml ...] [--set a.b=c ...] [--namespace NS]
    python deploy/render.py lint [-f VALUES.yaml ...]
    python deploy/render.py config [-f VALUES.yaml ...]   # the run config the orchestrator reads
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHART = Path(__file__).parent / "helm" / "tinkrl"


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def user_values(files: list[str], sets: list[str]) -> dict:
    import helm_python as helm

    values: dict = {}
    for f in files:
        values = _merge(values, helm.values_from_yaml(Path(f).read_text()) or {})
    for s in sets:
        values = _merge(values, helm.parse_set_string(s))
    return values


def render(values: dict, release: str = "tinkrl", namespace: str = "tinkrl") -> str:
    """All rendered manifests as one multi-document YAML stream, in `helm template`'s form."""
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        out = chart.render(values, name=release, namespace=namespace, is_install=True)
    docs = []
    for path in sorted(out):
        if path.endswith("NOTES.txt") or not out[path].strip():
            continue
        docs.append(f"---\n# Source: {path}\n{out[path].strip()}\n")
    return "".join(docs)


def run_config(manifests: str) -> str:
    """The run config (`config.yaml` of the chart's ConfigMap, the orchestrator's `$TINKRL_CONFIG`) in rendered
    manifests."""
    import yaml

    for doc in yaml.safe_load_all(manifests):
        if doc and doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
            return doc["data"]["config.yaml"]
    raise ValueError("the rendered manifests have no run config ConfigMap")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="deploy/render.py")
    p.add_argument("action", choices=("template", "lint", "config"))
    p.add_argument("-f", "--values", action="append", default=[])
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--namespace", default="tinkrl")
    p.add_argument("--release", default="tinkrl")
    args = p.parse_args(argv)
    try:
        import helm_python as helm
    except ImportError:
        print("deploy/render.py: needs helm-python-sdk (pip install -e '.[dev]') or a helm binary", file=sys.stderr)
        return 2
    values = user_values(args.values, args.set)
    if args.action in ("template", "config"):
        out = render(values, args.release, args.namespace)
        sys.stdout.write(out if args.action == "template" else run_config(out))
        return 0
    report = helm.lint(CHART, values, strict=True, namespace=args.namespace)
    for m in report.get("messages", []):
        level = {1: "INFO", 2: "WARNING", 3: "ERROR"}.get(m["severity"], "UNKNOWN")
        print(f"[{level}] {m['path']}: {m['error']}")
    bad = [m for m in report.get("messages", []) if m["severity"] >= 2] + report.get("errors", [])
    print(f"1 chart(s) linted, {len(bad)} chart(s) failed" if bad else "1 chart(s) linted, 0 chart(s) failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Load on the OpenAI-compatible server: 64 concurrent chat requests against sequential ones.

    .venv/bin/python bench/proxy_load.py [--model NAME] [--concurrent 64] [--sequential 16]
                                         [--max-tokens 32] [--runs 3] [--results DIR]

Starts `ProxyServer` over the embedded engine on a background thread and drives it with the
official `openai` client (AsyncOpenAI, one connection per request). Each request asks for
`--max-tokens` tokens at temperature 1 with a distinct seed and a distinct prompt, and
carries a rollout id so token capture is on, as in training. Reports wall time, requests/s,
completion tokens/s, latency p50/p99, and the number of failed requests (must be 0).
Throughput is compared in completion tokens/s, since completions may end early. Each run's
figures go to bench/results/proxy_load/<machine class>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time

import openai
from common import add_results_arg, write_result

from tinkrl.local import ServiceClient
from tinkrl.local.models import TINY_MODEL
from tinkrl.proxy.server import ProxyServer, serve_in_thread


async def one(client: openai.AsyncOpenAI, model: str, i: int, max_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"Request {i}: write a short note about the number {i}."}],
        max_tokens=max_tokens,
        temperature=1.0,
        seed=i,
        extra_headers={"X-Rollout-Id": f"bench-{i % 8}"},
    )
    return time.perf_counter() - t0, r.usage.completion_tokens


async def sequential(client, model: str, n: int, max_tokens: int) -> dict:
    t0, results = time.perf_counter(), []
    for i in range(n):
        results.append(await one(client, model, i, max_tokens))
    return summarise(results, time.perf_counter() - t0, 0)


async def concurrent(client, model: str, n: int, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    out = await asyncio.gather(*(one(client, model, 1000 + i, max_tokens) for i in range(n)), return_exceptions=True)
    wall = time.perf_counter() - t0
    ok = [r for r in out if not isinstance(r, BaseException)]
    for e in (r for r in out if isinstance(r, BaseException)):
        print(f"  failed: {type(e).__name__}: {e}")
    return summarise(ok, wall, len(out) - len(ok))


def summarise(results: list[tuple[float, int]], wall: float, errors: int) -> dict:
    lat = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))] if lat else float("nan")
    return {
        "requests": len(results),
        "errors": errors,
        "wall_s": wall,
        "req_per_s": len(results) / wall,
        "tok_per_s": tokens / wall,
        "p50_s": statistics.median(lat) if lat else float("nan"),
        "p99_s": p99,
    }


async def bench(url: str, model: str, args) -> list[tuple[dict, dict]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=1800)
    await sequential(client, model, 2, args.max_tokens)  # warm-up
    runs = []
    for run in range(args.runs):
        seq = await sequential(client, model, args.sequential, args.max_tokens)
        con = await concurrent(client, model, args.concurrent, args.max_tokens)
        print(f"run {run + 1}: sequential {fmt(seq)}\n       {args.concurrent} concurrent {fmt(con)}", flush=True)
        runs.append((seq, con))
    await client.close()
    return runs


FIGURES = ("tok_per_s", "req_per_s", "wall_s", "errors")  # recorded per run; latencies are printed only


def fmt(r: dict) -> str:
    return (
        f"{r['requests']} ok / {r['errors']} failed, {r['wall_s']:.2f} s, {r['req_per_s']:.2f} req/s, "
        f"{r['tok_per_s']:.1f} tok/s, latency p50 {r['p50_s']:.2f} s p99 {r['p99_s']:.2f} s"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=TINY_MODEL)
    p.add_argument("--concurrent", type=int, default=64)
    p.add_argument("--sequential", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    add_results_arg(p)
    args = p.parse_args()
    client = ServiceClient().create_sampling_client(base_model=args.model)
    server = ProxyServer(client, model_name=args.model)
    engine = getattr(client, "engine", None)
    print(f"model {args.model} on {getattr(engine, 'device', '?')} ({platform.processor() or platform.machine()})")
    with serve_in_thread(server) as url:
        runs = asyncio.run(bench(url, args.model, args))
    med = lambda xs: statistics.median(xs)  # noqa: E731
    seq_tok = med([s["tok_per_s"] for s, _ in runs])
    con_tok = med([c["tok_per_s"] for _, c in runs])
    errors = sum(c["errors"] for _, c in runs)
    print(
        f"\nmedian of {args.runs}: sequential {seq_tok:.1f} tok/s "
        f"({med([s['req_per_s'] for s, _ in runs]):.2f} req/s); {args.concurrent} concurrent {con_tok:.1f} tok/s "
        f"({med([c['req_per_s'] for _, c in runs]):.2f} req/s, wall {med([c['wall_s'] for _, c in runs]):.2f} s); "
        f"speed-up x{con_tok / seq_tok:.1f}; failed requests: {errors}"
    )
    repeats = {
        f"{side}/{k}": [r[k] for r in rs] for side, rs in zip(("sequential", "concurrent"), zip(*runs)) for k in FIGURES
    }
    settings = {k: getattr(args, k) for k in ("model", "concurrent", "sequential", "max_tokens", "runs")}
    write_result("proxy_load", args.model, settings, repeats, args.results)


if __name__ == "__main__":
    main()

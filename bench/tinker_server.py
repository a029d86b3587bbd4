"""Overhead of `tinkrl serve tinker`: the official SDK over HTTP vs the engine in-process.

Two measurements, written to bench/results/tinker_server/<machine class>.json:

1. The same 10 RL-shaped training steps (sample a group, forward_backward with
   importance_sampling, optim_step, fresh sampling client) on the default 135M model,
   in-process vs through the server.
2. Per-call latency with the tiny random-weight model, where compute is ~nothing and the
   protocol's cost shows: forward_backward, optim_step, sample (every call's milliseconds).

    .venv/bin/python bench/tinker_server.py [--steps 10] [--calls 30] [--model NAME] [--results DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TINKER_TELEMETRY", "0")

import tinker  # noqa: E402
from common import add_results_arg, write_result  # noqa: E402
from tinker import types  # noqa: E402

from tinkrl.local import ServiceClient as LocalServiceClient  # noqa: E402
from tinkrl.local.models import DEFAULT_MODEL, TINY_MODEL  # noqa: E402
from tinkrl.tinker_server.app import serve_in_thread  # noqa: E402


def _prompt(i: int) -> types.ModelInput:
    return types.ModelInput.from_ints([1] + [(37 * i + 11 * k) % 4000 + 100 for k in range(31)])


def rl_stepper(service: Any, model: str, group: int = 4, max_tokens: int = 8) -> Callable[[int], None]:
    """One RL-shaped step on a fresh LoRA client of `service`: sample, forward_backward, optim_step."""
    tc = service.create_lora_training_client(model, rank=8, seed=0).result()
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0, stop=[])
    adam = types.AdamParams(learning_rate=1e-4)

    def step(i: int) -> None:
        sampler = tc.save_weights_and_get_sampling_client().result()
        prompt = _prompt(i)
        result = sampler.sample(prompt, group, params).result()
        data = []
        for j, seq in enumerate(result.sequences):
            full = prompt.to_ints() + list(seq.tokens)
            n_prompt = prompt.length - 1
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={
                        "target_tokens": full[1:],
                        "logprobs": [0.0] * n_prompt + list(seq.logprobs or []),
                        "advantages": [0.0] * n_prompt + [float(j % 2) - 0.5] * len(seq.tokens),
                    },
                )
            )
        fb = tc.forward_backward(data, "importance_sampling")
        opt = tc.optim_step(adam)  # back to back: one round trip's wait covers both
        fb.result()
        opt.result()

    return step


def rl_steps(local: Any, remote: Any, model: str, steps: int) -> tuple[list[float], list[float]]:
    """Each step's seconds in-process and through the server, interleaved step by step so that
    load from other jobs on a shared machine falls on both sides alike."""
    local_step, remote_step = rl_stepper(local, model), rl_stepper(remote, model)
    local_step(0)
    remote_step(0)  # warm-up
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(1, steps + 1):
        for side, step in enumerate((local_step, remote_step)):
            t = time.perf_counter()
            step(i)
            times[side].append(time.perf_counter() - t)
    return times


def call_latencies(local: Any, remote: Any, model: str, calls: int) -> dict[str, list[list[float]]]:
    """Per call: [each call's ms in-process, each call's ms through the server], with the two
    sides alternating call by call so that other jobs' load falls on both alike."""
    ops_by_side = []
    for service in (local, remote):
        tc = service.create_lora_training_client(model, rank=8, seed=0).result()
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(list(range(100, 116))),
            loss_fn_inputs={"target_tokens": list(range(101, 117)), "weights": [1.0] * 16},
        )
        sampler = tc.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=0, stop=[])
        prompt = types.ModelInput.from_ints(list(range(100, 116)))
        ops_by_side.append(
            {
                "forward_backward": lambda tc=tc, datum=datum: tc.forward_backward([datum], "cross_entropy").result(),
                "optim_step": lambda tc=tc: tc.optim_step(types.AdamParams(learning_rate=1e-5)).result(),
                "sample (4 tokens)": lambda s=sampler, p=prompt, q=params: s.sample(p, 1, q).result(),
            }
        )
    out: dict[str, list[list[float]]] = {}
    for name in ops_by_side[0]:
        times: list[list[float]] = [[], []]
        for i in range(calls + 3):
            for side in (0, 1):
                t = time.perf_counter()
                ops_by_side[side][name]()
                if i >= 3:  # warm-up
                    times[side].append((time.perf_counter() - t) * 1000)
        out[name] = times
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    add_results_arg(ap)
    args = ap.parse_args()

    engine = LocalServiceClient()
    with serve_in_thread(engine) as url:
        remote = tinker.ServiceClient(base_url=url, api_key="tml-local")
        latencies = call_latencies(engine, remote, TINY_MODEL, args.calls)
        local_s, server_s = rl_steps(engine, remote, args.model, args.steps)
        remote.close("success").result()

    med = statistics.median
    print(f"RL step on {args.model}: in-process {med(local_s):.3f} s, through the server {med(server_s):.3f} s")
    repeats = {"rl_step_local_s": local_s, "rl_step_server_s": server_s}
    for name, (local_ms, server_ms) in latencies.items():
        print(f"{name} on {TINY_MODEL}: median / min ms in-process {med(local_ms):.1f} / {min(local_ms):.1f}, ", end="")
        print(f"through the server {med(server_ms):.1f} / {min(server_ms):.1f}")
        repeats |= {f"{name}/local_ms": local_ms, f"{name}/server_ms": server_ms}
    settings = {"model": args.model, "steps": args.steps, "calls": args.calls, "call_model": TINY_MODEL}
    settings["tinker_sdk"] = tinker.__version__
    write_result("tinker_server", args.model, settings, repeats, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

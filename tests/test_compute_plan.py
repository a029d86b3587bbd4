"""The engine's compute plan (`tinkrl/local/compute_plan.py`): one probe, the per-class rules, every decision
with a reason, made once, printed and recorded.

What must hold: each CPU class gets the paths its flags allow (faked through the probe), with a
reason for each; `ONEDNN_MAX_CPU_ISA` caps the flags the plan sees and the instruction set the
kernels are built for; the plan a run computed with is in its first lines and its run.json, and
`tinkrl serve tinker` reports it.
"""

from __future__ import annotations

import json

import httpx
import pytest
import tinker
from helpers.engine import TINY
from tinker import types

from tinkrl.local import ServiceClient
from tinkrl.local.compute_plan import Choice, make_plan, usable_flags
from tinkrl.tinker_server.app import serve_in_thread

pytestmark = pytest.mark.cpu_class  # `make test-avx2` runs it again as an AVX2-only CPU

ZEN4 = "fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16"
SAPPHIRE_RAPIDS = ZEN4 + " amx_tile amx_bf16 amx_int8"
LAPTOP = "fpu sse4_2 avx avx2 fma f16c"


@pytest.mark.parametrize(
    "flags, vendor_id, matched_decode, bf16_decode, projections, prefill, cache",
    [
        (ZEN4, "AuthenticAMD", "kernels", "one call", "dots dpbf16", "reference", "bfloat16"),
        (ZEN4, "GenuineIntel", "kernels", "one call", "dots fma", "kernels", "bfloat16"),
        (LAPTOP, "AuthenticAMD", "reference", "reference", "torch bf16", "reference", "float32"),
    ],
)
def test_each_class_gets_the_paths_its_flags_allow(
    fake_cpu, flags, vendor_id, matched_decode, bf16_decode, projections, prefill, cache
):
    machine = fake_cpu(flags, vendor_id)
    fp32 = Choice("float32", "as asked")
    for sampler, decode in (("matched", matched_decode), ("bfloat16", bf16_decode)):
        plan = make_plan(machine, "cpu", fp32, Choice(sampler, "as asked"), head_dim=64)
        assert plan.decode.path == decode, plan.line()
        for name, choice in plan.as_dict().items():
            if isinstance(choice, dict):
                assert choice["path"] and choice["why"], name  # every decision says why
    bf16 = make_plan(machine, "cpu", fp32, Choice("bfloat16", ""), head_dim=64)
    assert bf16.projections.path == projections
    assert bf16.cache.path == cache and bf16.prefill.path == prefill
    qwen3 = make_plan(machine, "cpu", fp32, Choice("bfloat16", ""), head_dim=128, qk_norm=True)
    assert qwen3.decode.path == ("kernels" if bf16_decode == "one call" else bf16_decode)  # q/k norms: op by op
    assert qwen3.one_call_rows == 0


def test_the_bf16_math_mode_is_set_only_where_it_multiplies_in_bf16(fake_cpu):
    bf16, matched = Choice("bfloat16", "as asked"), Choice("matched", "")
    amx = make_plan(fake_cpu(SAPPHIRE_RAPIDS), "cpu", bf16, matched, head_dim=64)
    assert amx.products.path == "bf16 math mode"
    for flags in (ZEN4, LAPTOP):
        plan = make_plan(fake_cpu(flags, "AuthenticAMD"), "cpu", bf16, matched, head_dim=64)
        assert plan.products.path == "fp32" and "without AMX" in plan.products.why


def test_without_kernels_the_reference_runs_and_says_why(fake_cpu):
    machine = fake_cpu(ZEN4, "AuthenticAMD", kernels=False)
    plan = make_plan(machine, "cpu", Choice("float32", ""), Choice("bfloat16", ""), head_dim=64)
    assert (plan.decode.path, plan.prefill.path, plan.cache.path) == ("reference", "reference", "float32")
    assert plan.decode.why == "no C compiler (cc) on PATH" and plan.projections.path == "onednn bf16"


@pytest.mark.parametrize(
    "cap, dropped, kept, isa",
    [
        ("AVX2", ("avx512f", "avx512_bf16", "amx_bf16"), ("avx2", "fma"), "-march=x86-64-v3"),
        ("AVX512_CORE", ("avx512_bf16", "amx_bf16"), ("avx512f", "avx2"), "-mno-avx512bf16"),
        ("AVX512_CORE_BF16", ("amx_bf16", "amx_tile"), ("avx512_bf16",), "-mno-amx-tile"),
        ("", (), ("amx_bf16", "avx512_bf16"), "-march=native"),
    ],
)
def test_onednns_isa_cap_is_the_plans_and_the_kernels(cap, dropped, kept, isa):
    flags, build = usable_flags(frozenset(SAPPHIRE_RAPIDS.split()), cap)
    assert not set(dropped) & flags and set(kept) <= flags
    assert isa in build[0]


def test_a_run_prints_and_records_its_plan(tiny_run):
    record = json.loads((tiny_run["run"] / "run.json").read_text())
    compute = record["compute"]
    assert compute["device"] == "cpu" and compute["sampler"]["path"] == "matched"  # the tests pin matched
    assert f"on local ({compute['line']})" in tiny_run["logs"]


def test_serve_tinker_reports_how_it_computes():
    engine = ServiceClient()
    with serve_in_thread(engine) as url:
        with tinker.ServiceClient(base_url=url, api_key="tml-local") as sc:
            tc = sc.create_lora_training_client(base_model=TINY, rank=4).result()
            body, key = {"model_id": tc.model_id, "type": "get_info"}, {"X-API-Key": "tml-local"}
            info = httpx.post(f"{url}/api/v1/get_info", json=body, headers=key)
            assert info.status_code == 200, info.text
            compute = info.json()["compute"]
            sampler = sc.create_sampling_client(base_model=TINY).result()
            sampler.sample(types.ModelInput.from_ints([1, 5]), 1, types.SamplingParams(max_tokens=1)).result()
        health = httpx.get(f"{url}/api/v1/healthz").json()
    assert compute["line"] and compute["precision"]["why"]
    assert health["status"] == "ok" and f"{TINY} on cpu" in health["compute"]

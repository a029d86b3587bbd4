"""Shared pieces for the embedded-engine tests: datum building, LoRA gradients, an isolated TINKRL_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from tinker import types

from tinkrl.local.compute_plan import probe

TINY = "tinkrl/tiny-llama"
REAL = "HuggingFaceTB/SmolLM2-135M-Instruct"
# Whether the engine's bf16 setting multiplies in bf16 here: on a CPU with AMX (no GPU). Elsewhere on
# CPU it computes fp32; on CUDA TF32.
BF16_ON_AMX = not torch.cuda.is_available() and probe().cpu_class == "amx_bf16"
# Where the bf16 setting really multiplies in reduced precision (TF32 on CUDA, bf16 on AMX's tiles,
# ~1e-2 relative) the exactness checks run in fp32. On other CPUs the bf16 setting computes fp32, and
# the engine tests run its code paths.
TEST_DTYPE = "float32" if torch.cuda.is_available() or BF16_ON_AMX else "bfloat16"
TEXTS = [
    "The quick brown fox jumps over the lazy dog while the cat watches from the fence.",
    "Question: what is 17 + 25? Answer: 42, because seventeen plus twenty-five is forty-two.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
]


def datum(tokens: list[int], **per_token) -> types.Datum:
    """A datum over full `tokens`: input = tokens[:-1], target_tokens = tokens[1:], other inputs as given
    (each already aligned with the targets, i.e. of length len(tokens) - 1)."""
    inputs = {"target_tokens": np.asarray(tokens[1:], dtype=np.int64)}
    for k, v in per_token.items():
        arr = np.asarray(v, dtype=np.float32)
        assert arr.shape == (len(tokens) - 1,), (k, arr.shape, len(tokens))
        inputs[k] = arr
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def logprobs_of(output: types.ForwardBackwardOutput) -> list[np.ndarray]:
    return [o["logprobs"].to_numpy().astype(np.float64) for o in output.loss_fn_outputs]


def on_engine(tc, fn):
    """Run `fn` on the training client's engine thread (between requests), return its result."""
    return tc.engine.submit(fn).result()


def lora_grads(tc) -> dict[str, torch.Tensor]:
    def grab():
        return {
            n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in tc.trainer.params.items()
        }

    return on_engine(tc, grab)


def zero_grads(tc) -> None:
    def clear():
        for p in tc.trainer.params.values():
            p.grad = None

    on_engine(tc, clear)


def lora_weights(tc) -> dict[str, torch.Tensor]:
    return on_engine(tc, lambda: {n: p.detach().clone() for n, p in tc.trainer.params.items()})


def randomize_lora(tc, scale: float = 0.05, seed: int = 0) -> None:
    """Give every LoRA matrix (B included, which peft starts at 0) random values, so the adapter is live."""

    def fill():
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, p in sorted(tc.trainer.params.items()):
                p.copy_(torch.randn(p.shape, generator=g) * scale)

    on_engine(tc, fill)


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([grads[k].flatten().double() for k in sorted(grads)])


def assert_close_vectors(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-3) -> None:
    """|a - b| <= rel * |b| (as whole vectors), and b is not trivially zero."""
    nb = float(b.norm())
    assert nb > 0, "reference gradient is zero: the test would prove nothing"
    err = float((a - b).norm())
    assert err <= rel * nb, f"relative difference {err / nb:.2e} > {rel:.0e}"


def real_models_dir() -> Path:
    """The user's tinkrl model cache (materialising the default model once if needed)."""
    from tinkrl.local.models import resolve_model_dir

    resolve_model_dir(REAL)  # dequantises the GGUF on a fresh machine (~20 s, once)
    home = Path(os.environ.get("TINKRL_HOME", Path.home() / ".tinkrl")).expanduser()
    return home / "models"


def disagreements(tc, sc, prompts: list[types.ModelInput], temperature: float, max_tokens: int = 16) -> np.ndarray:
    """|sampler - trainer| logprob of each token `sc` samples from `prompts` (2 each, one batch), the
    trainer's being `tc.forward` on the same tokens, as an RL datum trains on them."""
    params = types.SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=17, stop=[])
    futures = [sc.sample(p, 2, params) for p in prompts]  # submitted together: decoded as one batch
    responses = [f.result() for f in futures]
    data, spans = [], []
    for p, resp in zip(prompts, responses):
        for s in resp.sequences:
            assert len(s.tokens) == max_tokens and len(s.logprobs) == max_tokens
            full = p.to_ints() + list(s.tokens)
            weights = np.zeros(len(full) - 1)
            weights[p.length - 1 :] = 1.0  # the sampled tokens
            data.append(datum(full, weights=weights))
            spans.append((p.length - 1, np.asarray(s.logprobs, dtype=np.float64)))
    fwd = logprobs_of(tc.forward(data).result())
    return np.concatenate([np.abs(lp[start:] - sampled) for lp, (start, sampled) in zip(fwd, spans)])


def max_disagreement(tc, sc, prompts: list[types.ModelInput], temperature: float, max_tokens: int = 16) -> float:
    """The largest of `disagreements`."""
    return float(disagreements(tc, sc, prompts, temperature, max_tokens).max())


# A bf16 sampler against the fp32 trainer (random-weight tiny models, T=1): its rounding moves a
# token's logprob by about 0.02 on average on every path it takes (the kernels' or torch's products),
# and a rare low-probability token's by up to ~0.2 in some draws, so the mean carries the claim.
BF16_MEAN_BOUND = 0.04
BF16_MAX_BOUND = 0.3


def assert_bf16_tracks(tc, sc, prompts: list[types.ModelInput]) -> float:
    """The bf16 sampler `sc` samples `tc`'s policy within bf16 rounding (not its arithmetic: some
    disagreement); returns the mean |dlogprob|."""
    d = disagreements(tc, sc, prompts, temperature=1.0)
    print(f"bf16 sampler vs fp32 trainer: mean |dlogprob| {d.mean():.2e}, max {d.max():.2e}")
    assert 0 < d.mean() < BF16_MEAN_BOUND and d.max() < BF16_MAX_BOUND
    return float(d.mean())


def assert_agreement_before_and_after_a_step(tc, prompts: list[types.ModelInput], tol: float, label: str) -> None:
    """Sampler and trainer agree within `tol` at T=1 and T=0.7, for the base weights and after an
    optim_step has made the LoRA adapter visibly non-zero."""
    for temperature in (1.0, 0.7):
        diff = max_disagreement(tc, tc.save_weights_and_get_sampling_client(), prompts, temperature)
        print(f"{label} base T={temperature}: max |sample - forward| = {diff:.2e}")
        assert diff <= tol
    probe = [datum(p.to_ints() + [42, 43, 44], weights=np.ones(p.length + 2)) for p in prompts]
    before = np.concatenate(logprobs_of(tc.forward(probe).result()))
    tc.forward_backward(probe).result()
    tc.optim_step(types.AdamParams(learning_rate=2e-3)).result()
    after = np.concatenate(logprobs_of(tc.forward(probe).result()))
    assert np.abs(after - before).max() > 0.05  # the adapter is live
    trained_sc = tc.save_weights_and_get_sampling_client()
    for temperature in (1.0, 0.7):
        diff = max_disagreement(tc, trained_sc, prompts, temperature)
        print(f"{label} trained T={temperature}: max |sample - forward| = {diff:.2e}")
        assert diff <= tol

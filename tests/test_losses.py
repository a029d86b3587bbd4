"""The built-in losses equal their documented formulas (docs/design.md, "The seam"), in value and in gradient.

Values: `loss:sum` from forward/forward_backward against the formula evaluated in torch on the
logprobs the engine reports. Gradients: the LoRA gradients forward_backward leaves behind
against forward_backward_custom running our own formula on the engine's own logprobs (the same
logprob function, so any difference is the loss's). Plus sum reduction, RL losses ignoring
`weights`, and one clear error for every kind of bad input.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.engine import (
    TEST_DTYPE,
    TEXTS,
    TINY,
    assert_close_vectors,
    datum,
    flat,
    logprobs_of,
    lora_grads,
    on_engine,
    randomize_lora,
    zero_grads,
)

from tinkrl.local import ServiceClient
from tinkrl.local.losses import LossInputError


@pytest.fixture(scope="module")
def tc():
    client = ServiceClient(dtype=TEST_DTYPE).create_lora_training_client(TINY, rank=4, seed=0)
    randomize_lora(client, scale=0.05)
    return client


@pytest.fixture(scope="module")
def seqs(tc):
    tok = tc.get_tokenizer()
    return [tok.encode(t)[:24] for t in TEXTS[:2]]


def rl_inputs(tc, seqs, prompt_len: int = 6, spread: float = 0.5):
    """Hand-built RL inputs: sampler logprobs = the learner's own minus a spread of offsets (so ratios
    land below, inside and above the clip ranges) on 'action' positions, advantage +/-, prompt = 0."""
    plain = [datum(s, weights=np.ones(len(s) - 1)) for s in seqs]
    lps = logprobs_of(tc.forward(plain, "cross_entropy").result())
    out = []
    for k, (s, lp) in enumerate(zip(seqs, lps)):
        n = len(s) - 1
        action = np.arange(n) >= prompt_len - 1
        offsets = np.linspace(-spread, spread, n)[:: (1 if k == 0 else -1)]
        q = np.where(action, lp + offsets, 0.0)
        adv = np.where(action, 1.5 if k == 0 else -0.7, 0.0)
        out.append({"logprobs": q, "advantages": adv, "action": action.astype(np.float32)})
    return out


# -- the formulas, written from docs/design.md's loss semantics in torch ----------------------------------------------------


def formula(loss_fn: str, lp: torch.Tensor, inp: dict, cfg: dict | None = None) -> torch.Tensor:
    cfg = cfg or {}
    t = {k: torch.as_tensor(np.asarray(v), dtype=torch.float64) for k, v in inp.items()}
    lp = lp.double()
    if loss_fn == "cross_entropy":
        return -(lp * t["weights"]).sum()
    q, a = t["logprobs"], t["advantages"]
    if loss_fn == "importance_sampling":
        return -(torch.exp(lp - q) * a).sum()
    if loss_fn == "ppo":
        lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
        r = torch.exp(lp - q)
        return -torch.minimum(r * a, r.clamp(lo, hi) * a).sum()
    if loss_fn == "cispo":
        lo, hi = cfg.get("clip_low_threshold", 0.0), cfg.get("clip_high_threshold", 4.0)
        # the clipped ratio is a constant (stop-gradient): computed from values, outside autograd
        coef = torch.exp(lp.detach() - q).clamp(lo, hi)
        return -(coef * lp * a).sum()
    if loss_fn == "dro":
        return -(lp * a - 0.5 * cfg["beta"] * (lp - q) ** 2).sum()
    if loss_fn == "gspo":
        lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
        m = t["sequence_ratio_mask"] != 0
        s = float(torch.exp((lp.detach() - q)[m].mean()))  # the sequence ratio (a value)
        r = s * torch.exp(lp - lp.detach())  # value s on every token, d r_t = s * d lp_t
        return -torch.minimum(r * a, r.clamp(lo, hi) * a).sum()
    raise AssertionError(loss_fn)


CASES = [
    ("importance_sampling", None),
    ("ppo", None),
    ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}),
    ("cispo", None),
    ("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ("dro", {"beta": 0.3}),
    ("gspo", None),
    ("gspo", {"clip_low_threshold": 0.95, "clip_high_threshold": 1.02}),
]


def build(tc, seqs, loss_fn: str, spread: float = 0.5):
    rl = rl_inputs(tc, seqs, spread=spread)
    data, inputs = [], []
    for s, r in zip(seqs, rl):
        per = {"logprobs": r["logprobs"], "advantages": r["advantages"]}
        if loss_fn == "gspo":
            per["sequence_ratio_mask"] = r["action"]
        if loss_fn == "cross_entropy":
            per = {"weights": np.where(r["action"] > 0, 1.0, 0.25)}
        data.append(datum(s, **per))
        inputs.append(per)
    return data, inputs


@pytest.mark.parametrize("loss_fn,cfg", [("cross_entropy", None)] + CASES)
def test_loss_value_and_gradient_equal_formula(tc, seqs, loss_fn, cfg):
    data, inputs = build(tc, seqs, loss_fn)
    fwd = tc.forward(data, loss_fn, cfg).result()
    lps = logprobs_of(fwd)
    expected = sum(float(formula(loss_fn, torch.tensor(lp), inp, cfg)) for lp, inp in zip(lps, inputs))
    assert fwd.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4)

    zero_grads(tc)
    fb = tc.forward_backward(data, loss_fn, cfg).result()
    assert fb.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    engine_grad = flat(lora_grads(tc))
    zero_grads(tc)
    custom = tc.forward_backward_custom(
        data, lambda _data, lps_t: (sum(formula(loss_fn, lp, inp, cfg) for lp, inp in zip(lps_t, inputs)), {})
    ).result()
    assert custom.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    reference_grad = flat(lora_grads(tc))
    zero_grads(tc)
    assert_close_vectors(engine_grad, reference_grad, rel=2e-3)


def test_clip_ranges_are_exercised(tc, seqs):
    """The hand-built ratios span both sides of every clip range above, so the clip tests can fail."""
    rl = rl_inputs(tc, seqs)
    lps = logprobs_of(tc.forward([datum(s, weights=np.ones(len(s) - 1)) for s in seqs], "cross_entropy").result())
    ratios = np.concatenate([np.exp(lp - r["logprobs"])[r["action"] > 0] for lp, r in zip(lps, rl)])
    assert ratios.min() < 0.8 and ratios.max() > 1.2
    assert ((ratios > 0.9) & (ratios < 1.05)).any()


def test_configured_ppo_clip_changes_the_loss(tc, seqs):
    data, _ = build(tc, seqs, "ppo")

    def loss(cfg=None):
        return tc.forward(data, "ppo", cfg).result().metrics["loss:sum"]

    default = loss()
    explicit = loss({"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    tight = loss({"clip_low_threshold": 0.99, "clip_high_threshold": 1.01})
    assert default == pytest.approx(explicit, rel=1e-6)
    assert abs(tight - default) > 1e-3


def test_cispo_stops_the_gradient_through_the_ratio(tc, seqs):
    """cispo's gradient is sg(clip(r))·A·∇lp; without the stop-gradient it would also carry r·lp·A·∇lp."""
    data, inputs = build(tc, seqs, "cispo")
    zero_grads(tc)
    tc.forward_backward(data, "cispo").result()
    engine_grad = flat(lora_grads(tc))
    zero_grads(tc)

    def no_stop_gradient(_data, lps):
        total = 0
        for lp, inp in zip(lps, inputs):
            q, a = torch.as_tensor(inp["logprobs"]).double(), torch.as_tensor(inp["advantages"]).double()
            total = total - (torch.exp(lp.double() - q).clamp(0.0, 4.0) * lp.double() * a).sum()
        return total, {}

    tc.forward_backward_custom(data, no_stop_gradient).result()
    wrong_grad = flat(lora_grads(tc))
    zero_grads(tc)
    assert float((engine_grad - wrong_grad).norm()) > 0.05 * float(wrong_grad.norm())


def test_gspo_ratio_is_the_sequence_mean(tc, seqs):
    """With a zero-advantage token in the mask, gspo's ratio still comes from every masked token."""
    data, inputs = build(tc, seqs, "gspo", spread=0.05)  # ratios near 1: no clipping
    fwd = tc.forward(data, "gspo").result()
    lps = logprobs_of(fwd)
    expected = 0.0
    for lp, inp in zip(lps, inputs):
        m = inp["sequence_ratio_mask"] > 0
        s = np.exp(np.mean((lp - inp["logprobs"])[m]))
        expected += -(s * inp["advantages"]).sum()
    assert fwd.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)


def test_sum_reduction_no_length_normalisation(tc, seqs):
    for loss_fn, cfg in [("cross_entropy", None), ("importance_sampling", None), ("dro", {"beta": 0.1})]:
        data, _ = build(tc, seqs, loss_fn)
        one = tc.forward(data[:1], loss_fn, cfg).result().metrics["loss:sum"]
        other = tc.forward(data[1:], loss_fn, cfg).result().metrics["loss:sum"]
        both = tc.forward(data, loss_fn, cfg).result().metrics["loss:sum"]
        doubled = tc.forward([data[0], data[0]], loss_fn, cfg).result().metrics["loss:sum"]
        assert both == pytest.approx(one + other, rel=1e-5, abs=1e-4)
        assert doubled == pytest.approx(2 * one, rel=1e-5, abs=1e-4)
    # a longer datum is not divided by its length: cross_entropy over 2x the tokens ~ 2x the loss terms
    s = seqs[0]
    short = datum(s, weights=np.r_[np.ones(10), np.zeros(len(s) - 11)])
    lp = logprobs_of(tc.forward([datum(s, weights=np.ones(len(s) - 1))], "cross_entropy").result())[0]
    loss = tc.forward([short], "cross_entropy").result().metrics["loss:sum"]
    assert loss == pytest.approx(-lp[:10].sum(), rel=1e-4)


@pytest.mark.parametrize("loss_fn,cfg", CASES)
def test_rl_losses_ignore_weights(tc, seqs, loss_fn, cfg):
    data, inputs = build(tc, seqs, loss_fn)
    base = tc.forward(data, loss_fn, cfg).result().metrics["loss:sum"]
    rng = np.random.default_rng(0)
    weighted = [datum(s, weights=rng.uniform(0, 3, len(s) - 1), **inp) for s, inp in zip(seqs, inputs)]
    zeroed = [datum(s, weights=np.zeros(len(s) - 1), **inp) for s, inp in zip(seqs, inputs)]
    assert tc.forward(weighted, loss_fn, cfg).result().metrics["loss:sum"] == pytest.approx(base, rel=1e-6)
    assert tc.forward(zeroed, loss_fn, cfg).result().metrics["loss:sum"] == pytest.approx(base, rel=1e-6)


def _error(fut) -> str:
    with pytest.raises(LossInputError) as info:
        fut.result()
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_unknown_loss_names_the_choices(tc, seqs):
    data, _ = build(tc, seqs, "cross_entropy")
    msg = _error(tc.forward_backward(data, "reinforce++"))
    assert "reinforce++" in msg and "cross_entropy" in msg and "ppo" in msg and "gspo" in msg


def test_missing_input_key_names_what_is_needed(tc, seqs):
    s = seqs[0]
    n = len(s) - 1
    msg = _error(tc.forward_backward([datum(s, logprobs=np.zeros(n))], "ppo"))
    assert "advantages" in msg and "ppo" in msg
    msg = _error(tc.forward_backward([datum(s, logprobs=np.zeros(n), advantages=np.zeros(n))], "gspo"))
    assert "sequence_ratio_mask" in msg
    msg = _error(tc.forward([datum(s)], "cross_entropy"))
    assert "weights" in msg
    # every datum is checked, not only the first
    full = datum(s, logprobs=np.zeros(n), advantages=np.zeros(n))
    msg = _error(tc.forward_backward([full, datum(s, logprobs=np.zeros(n))], "importance_sampling"))
    assert "datum 1" in msg and "advantages" in msg


def test_bad_config_key_names_the_allowed_keys(tc, seqs):
    data, _ = build(tc, seqs, "ppo")
    msg = _error(tc.forward_backward(data, "ppo", {"clip_epsilon": 0.2}))
    assert "clip_epsilon" in msg and "clip_low_threshold" in msg and "clip_high_threshold" in msg
    msg = _error(tc.forward_backward(data, "importance_sampling", {"beta": 0.1}))
    assert "beta" in msg and "importance_sampling" in msg
    msg = _error(tc.forward_backward(data, "dro"))
    assert "beta" in msg


def test_datum_alignment(tc, seqs):
    """target_tokens[i] is the token after input[i]: the logprob at i is log p(full[i+1] | full[:i+1])."""
    s = seqs[0]
    out = logprobs_of(tc.forward([datum(s, weights=np.ones(len(s) - 1))], "cross_entropy").result())[0]
    assert out.shape == (len(s) - 1,)
    # a prefix datum sees the same context: its logprobs are the leading entries
    prefix = logprobs_of(tc.forward([datum(s[:9], weights=np.ones(8))], "cross_entropy").result())[0]
    np.testing.assert_allclose(prefix, out[:8], atol=1e-4)
    # changing the last target token changes only the last logprob
    alt = list(s)
    alt[-1] = (alt[-1] + 1) % 1000 + 5
    changed = logprobs_of(tc.forward([datum(alt, weights=np.ones(len(s) - 1))], "cross_entropy").result())[0]
    np.testing.assert_allclose(changed[:-1], out[:-1], atol=1e-4)
    assert abs(changed[-1] - out[-1]) > 1e-3


def test_wrong_length_input_is_a_clear_error(tc, seqs):
    s = seqs[0]
    n = len(s) - 1
    from tinker import types

    bad = types.Datum(
        model_input=types.ModelInput.from_ints(s[:-1]),
        loss_fn_inputs={
            "target_tokens": np.asarray(s[1:], dtype=np.int64),
            "weights": np.ones(n + 1, dtype=np.float32),
        },
    )
    msg = _error(tc.forward_backward([bad], "cross_entropy"))
    assert "weights" in msg and str(n + 1) in msg and str(n) in msg
    full_targets = types.Datum(
        model_input=types.ModelInput.from_ints(s[:-1]),
        loss_fn_inputs={"target_tokens": np.asarray(s, dtype=np.int64), "weights": np.ones(n, dtype=np.float32)},
    )
    msg = _error(tc.forward([full_targets], "cross_entropy"))
    assert "target_tokens" in msg


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling"])
def test_gradient_is_the_derivative_of_the_reported_loss(seqs, loss_fn):
    """Independent of any formula: a central finite difference of `loss:sum` along the gradient
    direction equals the gradient's norm (fp32 engine, so the difference is not rounding noise)."""
    tc = ServiceClient(dtype="float32").create_lora_training_client(TINY, rank=4, seed=0)
    randomize_lora(tc, scale=0.05, seed=3)
    data, _ = build(tc, seqs, loss_fn, spread=0.2)
    zero_grads(tc)
    loss0 = tc.forward_backward(data, loss_fn).result().metrics["loss:sum"]
    grads = lora_grads(tc)
    zero_grads(tc)
    norm = float(flat(grads).norm())
    assert norm > 0
    eps = 1e-2

    def shift(step: float) -> None:
        def move():
            with torch.no_grad():
                for n, p in tc.trainer.params.items():
                    p.add_(grads[n].to(p.dtype) * (step / norm))

        on_engine(tc, move)

    def loss_at(sign: float) -> float:
        shift(sign * eps)
        value = tc.forward(data, loss_fn).result().metrics["loss:sum"]
        shift(-sign * eps)
        return value

    directional = (loss_at(+1) - loss_at(-1)) / (2 * eps)
    assert directional == pytest.approx(norm, rel=0.03)
    assert tc.forward(data, loss_fn).result().metrics["loss:sum"] == pytest.approx(loss0, rel=1e-6, abs=1e-5)

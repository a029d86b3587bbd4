"""Preference pairs and the DPO loss: what `tinkrl dpo` trains on and how.

A pair is two token sequences that share a prompt, the preferred (`chosen`) and the other
(`rejected`), each with weight 1 on its completion tokens. They come from a JSONL file in the
field's common layouts (`load_pairs`), a Hugging Face dataset, or a tinkrl run's own rollouts, the
best of each group over its worst or over each worse one (`pairs_from_run`: exact sampled tokens, no
re-rendering).

The loss is DPO's (Rafailov et al., 2023), computed exactly on the policy's logprobs of the
completion tokens against a frozen reference's: with `r = beta * (log pi(y|x) - log ref(y|x))`, the
pair's loss is `-log sigmoid(r_chosen - r_rejected)`, averaged over the batch. It runs through
`forward_backward_custom`, which the embedded engine differentiates in place and the Tinker SDK runs
client-side on top of `forward`, so one loss serves every backend.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinker import types

from tinkrl.errors import ConfigError
from tinkrl.rl.run_dir import trained_model
from tinkrl.rl.supervised import Message, jsonl_records, to_datum
from tinkrl.tracking import read_jsonl

HF_PREFIX = "hf:"
_HH_TURN = re.compile(r"\n\n(Human|Assistant): ")


@dataclass(frozen=True)
class TextPair:
    """A pair as messages: the shared prompt and the two assistant replies. `source` names its record."""

    prompt: list[Message]
    chosen: Message
    rejected: Message
    source: str


@dataclass(frozen=True)
class TokenPair:
    """A pair as token sequences with per-token weights (1 on the completion), ready to train."""

    chosen: tuple[list[int], list[float]]
    rejected: tuple[list[int], list[float]]
    source: str


# -- reading pairs -------------------------------------------------------------------------------


def _hh_messages(text: str) -> list[Message]:
    """An HH-RLHF transcript (`\\n\\nHuman: ...\\n\\nAssistant: ...`) as chat messages."""
    parts = _HH_TURN.split(text)
    if len(parts) < 3 or parts[0].strip():
        raise ValueError("a transcript string must be turns of '\\n\\nHuman: ' and '\\n\\nAssistant: '")
    roles = {"Human": "user", "Assistant": "assistant"}
    return [{"role": roles[r], "content": c} for r, c in zip(parts[1::2], parts[2::2])]


def _as_messages(value: Any, field: str) -> list[Message]:
    """A record's field as messages: a message list, one message, or a string (an assistant reply, or an
    HH-RLHF transcript when it has the transcript's turn markers)."""
    if isinstance(value, str):
        return _hh_messages(value) if _HH_TURN.match(value) else [{"role": "assistant", "content": value}]
    if isinstance(value, dict) and "role" in value:
        return [value]
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return list(value)
    raise ValueError(f'"{field}" must be a string, a message or a list of messages')


def _prompt_messages(value: Any) -> list[Message]:
    """A record's prompt: a string (one user turn) or messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return _as_messages(value, "prompt")


def _reply(messages: list[Message], prompt: list[Message], field: str) -> Message:
    """The one assistant reply `messages` add to `prompt` (a list that repeats the prompt first, as
    UltraFeedback's and HH-RLHF's do, or the reply alone)."""
    if messages[: len(prompt)] == prompt and len(messages) > len(prompt):
        messages = messages[len(prompt) :]
    if len(messages) != 1 or messages[0].get("role") != "assistant":
        raise ValueError(f'"{field}" must add one assistant reply to the prompt')
    content = messages[0].get("content")
    if not isinstance(content, str) or not content.strip():
        raise ValueError(f'"{field}" is an empty completion')
    return messages[0]


def parse_pair(record: Any, source: str) -> TextPair:
    """One record as a pair, or a ConfigError naming `source` and what is wrong. The layouts: `prompt` (a string
    or messages) or `conversation`/`messages`, with `chosen` and `rejected` (replies, or the whole conversation
    ending in the reply); or `chosen` and `rejected` alone, two HH-RLHF transcripts or message lists that share
    every turn but the last."""
    try:
        if not isinstance(record, dict):
            raise ValueError("expected a JSON object")
        for field in ("chosen", "rejected"):
            if field not in record:
                raise ValueError(f'missing "{field}" (a pair needs "chosen" and "rejected", and a prompt)')
        chosen, rejected = _as_messages(record["chosen"], "chosen"), _as_messages(record["rejected"], "rejected")
        prompt_key = next((k for k in ("prompt", "conversation", "messages") if k in record), None)
        if prompt_key is not None:
            prompt = _prompt_messages(record[prompt_key])
        elif len(chosen) > 1 and chosen[:-1] == rejected[:-1]:
            prompt = chosen[:-1]
        else:
            raise ValueError('missing "prompt" (or "conversation"), and "chosen" and "rejected" share no prompt')
        if not prompt or prompt[-1].get("role") == "assistant":
            raise ValueError("the prompt must end with a turn the assistant answers")
        return TextPair(prompt, _reply(chosen, prompt, "chosen"), _reply(rejected, prompt, "rejected"), source)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_pairs(spec: str, split: str = "train") -> list[TextPair]:
    """The pairs of a JSONL file, or of a Hugging Face dataset (`hf:NAME`, its `split`), each checked by
    `parse_pair`. A missing file, an unreachable dataset or an empty one is one ConfigError line."""
    if spec.startswith(HF_PREFIX):
        return _hf_pairs(spec[len(HF_PREFIX) :], split)
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"dpo.pairs: no such file {spec} (a JSONL file of pairs, hf:DATASET, or a tinkrl run directory)"
        )
    return [parse_pair(record, where) for where, record in jsonl_records(path, "pairs")]


def _hf_pairs(name: str, split: str) -> list[TextPair]:
    """A Hugging Face preference dataset's rows as pairs (downloaded by `datasets` into its cache)."""
    try:
        import datasets

        rows = datasets.load_dataset(name, split=split)
    except Exception as e:  # offline, a wrong name or split: say which, and the way on
        raise ConfigError(
            f"dpo.pairs: cannot load Hugging Face dataset {name!r} split {split!r} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); online, check the name; offline, give a JSONL file"
        ) from None
    pairs = [parse_pair(dict(row), f"{name}[{split}][{i}]") for i, row in enumerate(rows)]
    if not pairs:
        raise ConfigError(f"dpo.pairs: {name} split {split} has no rows")
    return pairs


def pairs_from_run(run_dir: Path, model_name: str, max_step: int | None = None, each: bool = False) -> list[TokenPair]:
    """The best and the worst rollout of each group a run trained (`rollouts/step_*.jsonl`: rollouts of one step,
    environment and prompt), where their rewards differ; with `each`, the best against every rollout rewarded
    below it. `max_step` keeps the first steps only. The tokens are the run's own samples, so the run must be
    of `model_name`."""
    trained = trained_model(run_dir)
    if trained is None:
        raise ConfigError(f"dpo.pairs: {run_dir} is not a tinkrl run directory (it has no config.yaml)")
    if trained != model_name:
        raise ConfigError(
            f"dpo.pairs: {run_dir} sampled {trained}, but this run trains {model_name}: its tokens mean other "
            f"text; set model_name={trained} or pair another run"
        )
    files = sorted((run_dir / "rollouts").glob("step_*.jsonl"))
    pairs: list[TokenPair] = []
    for path in files:
        step = int(path.stem.removeprefix("step_"))
        if max_step is not None and step > max_step:
            continue
        groups: dict[tuple[str, str], list[tuple[int, dict]]] = {}
        for n, row in enumerate(read_jsonl(path), 1):
            groups.setdefault((str(row.get("env")), str(row.get("prompt"))), []).append((n, row))
        for rows in groups.values():
            best = max(rows, key=lambda r: r[1]["reward"])
            worse = [r for r in rows if r[1]["reward"] < best[1]["reward"]]
            if not each and worse:
                worse = [min(worse, key=lambda r: r[1]["reward"])]
            pairs += [
                TokenPair(_sequence(best[1]), _sequence(other[1]), f"{path}:{best[0]} over {path}:{other[0]}")
                for other in worse
            ]
    if not pairs:
        steps = f" in its first {max_step} steps" if max_step else ""
        raise ConfigError(f"dpo.pairs: {run_dir} has no group whose rollouts' rewards differ{steps}")
    return pairs


def _sequence(row: dict) -> tuple[list[int], list[float]]:
    """A rollout row's tokens and their weights (its mask: 1 on the sampled tokens)."""
    return list(row["tokens"]), [float(w) for w in row["mask"]]


def tokenize_pair(renderer: Any, pair: TextPair) -> TokenPair:
    """A pair's prompt and replies as the model's tokens: the prompt as the renderer's generation prompt, each
    reply's action tokens after it (weight 1), as the model would sample them."""
    prompt = renderer.prompt_tokens(pair.prompt)

    def sequence(reply: Message) -> tuple[list[int], list[float]]:
        action = renderer.action_tokens(reply)
        return prompt + action, [0.0] * len(prompt) + [1.0] * len(action)

    return TokenPair(sequence(pair.chosen), sequence(pair.rejected), pair.source)


def pair_datums(pairs: Iterable[TokenPair], max_length: int) -> list[types.Datum]:
    """The pairs as datums, chosen then rejected for each, cut to `max_length` tokens; a pair with a side left
    without a completion token after the cut is a ConfigError naming it."""
    out = []
    for pair in pairs:
        for side, (tokens, weights) in (("chosen", pair.chosen), ("rejected", pair.rejected)):
            if not any(weights[1 : max_length + 1]):
                raise ConfigError(
                    f"{pair.source}: the {side} completion has no tokens within dpo.max_length={max_length}"
                )
            out.append(to_datum(tokens, weights, max_length))
    return out


# -- the reference and the loss ------------------------------------------------------------------


def completion_logprob(logprobs: Sequence[float | None], datum: types.Datum) -> float:
    """The summed logprob of a datum's weighted target tokens, from `compute_logprobs` over its whole sequence
    (whose first entry, the first token's, has no context and is None)."""
    weights = datum.loss_fn_inputs["weights"].data
    return float(sum(w * float(lp) for w, lp in zip(weights, logprobs[1:]) if w))


async def reference_logprobs(sampling_client: Any, datums: Sequence[types.Datum]) -> list[float]:
    """Each datum's completion logprob under the frozen reference, all requested at once."""
    import asyncio

    def full_sequence(d: types.Datum) -> types.ModelInput:
        targets = d.loss_fn_inputs["target_tokens"].data
        return types.ModelInput.from_ints(d.model_input.to_ints() + [int(targets[-1])])

    results = await asyncio.gather(*(sampling_client.compute_logprobs(full_sequence(d)) for d in datums))
    return [completion_logprob(lps, d) for lps, d in zip(results, datums)]


def dpo_loss(beta: float, reference: Sequence[float]) -> Callable[[list[types.Datum], list[Any]], tuple[Any, dict]]:
    """The DPO loss over a batch laid out chosen, rejected, chosen, ...: `reference` holds each datum's
    completion logprob under the reference. Returns the `forward_backward_custom` loss function, whose metrics
    are the batch's mean loss, reward margin, accuracy (chosen rewarded above rejected) and both rewards."""
    import torch
    import torch.nn.functional as F

    def loss_fn(data: list[types.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        if len(data) != len(reference) or len(data) % 2:
            raise ValueError(f"DPO batch of {len(data)} datums for {len(reference)} reference logprobs")
        policy = torch.stack(
            [
                (lp.double() * torch.as_tensor(d.loss_fn_inputs["weights"].data, dtype=torch.float64)).sum()
                for d, lp in zip(data, logprobs)
            ]
        )
        ref = torch.as_tensor(list(reference), dtype=torch.float64)
        rewards = beta * (policy - ref)
        chosen, rejected = rewards[0::2], rewards[1::2]
        margin = chosen - rejected
        loss = -F.logsigmoid(margin).mean()
        metrics = {
            "dpo/loss": float(loss.detach()),
            "dpo/margin": float(margin.detach().mean()),
            "dpo/accuracy": float((margin.detach() > 0).double().mean()),
            "dpo/chosen_reward": float(chosen.detach().mean()),
            "dpo/rejected_reward": float(rejected.detach().mean()),
        }
        return loss, metrics

    return loss_fn

"""Supervised fine-tuning through the Tinker API: conversations -> weighted token datums -> cross_entropy.

A conversation is laid out exactly as a multi-turn episode is sampled: the prompt up to the first
assistant turn, then each assistant turn's action tokens (weight 1, what the model learns to
write), and after it the renderer's next prompt (`next_prompt`, weight 0 on the observations and
the next header). Where the chat format keeps past turns as sampled, that extends the tokens so
far and the conversation is one datum; where it rewrites them (past thinking dropped: Qwen3,
DeepSeek V3.1/V4.1 thinking, Kimi, Nemotron 3, gpt-oss), a new datum starts at the family's own
prompt for the turn, as tinker-cookbook does, so no later turn trains on a context holding
thinking that inference drops. So a warm start on an agent's transcripts trains the very tokens
RL later samples. Used by the RL loop's warm start (`warm_start:`) and by `tinkrl sft`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tinker import types

from tinkrl.errors import ConfigError
from tinkrl.progress import progress_bar

Message = dict[str, Any]


def adam_params(config, learning_rate: float) -> types.AdamParams:
    """AdamW settings of a run's config (`adam_*`, weight decay, clipping) at `learning_rate`."""
    return types.AdamParams(
        learning_rate=learning_rate,
        beta1=config.adam_beta1,
        beta2=config.adam_beta2,
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
        grad_clip_norm=config.grad_clip_norm,
    )


def conversation_datums(
    renderer, messages: list[Message], tools: list[dict] | None = None
) -> list[tuple[list[int], list[float]]]:
    """A conversation as (tokens, weights) sequences, laid out as an episode samples it (see the module
    docstring): weight 1 on every assistant turn's action tokens, 0 elsewhere; one sequence while each
    next prompt extends the tokens so far, a new one where the chat format rewrites its history."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns or turns[0] == 0:
        raise ValueError("a conversation needs a prompt (system/user turns) and then an assistant turn")
    out: list[tuple[list[int], list[float]]] = []
    prompt = renderer.prompt_tokens(messages[: turns[0]], tools)
    tokens, weights = list(prompt), [0.0] * len(prompt)
    for i, nxt_turn in zip(turns, [*turns[1:], None]):
        action = renderer.action_tokens(messages[i])
        tokens, weights = tokens + action, weights + [1.0] * len(action)
        if nxt_turn is None:
            break
        prompt = renderer.next_prompt(prompt, action, messages[: i + 1], messages[i + 1 : nxt_turn], tools)
        if prompt[: len(tokens)] != tokens:  # the format rewrote its history: a new datum
            out.append((tokens, weights))
            tokens, weights = [], []
        weights += [0.0] * (len(prompt) - len(tokens))
        tokens = list(prompt)
    out.append((tokens, weights))
    return out


def to_datum(tokens: list[int], weights: list[float], max_length: int | None = None) -> types.Datum:
    """The shifted cross_entropy datum (input = tokens[:-1], targets and weights = [1:]), cut to max_length."""
    if max_length is not None:
        tokens, weights = tokens[: max_length + 1], weights[: max_length + 1]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]),
            "weights": types.TensorData(data=weights[1:], dtype="float32", shape=[len(tokens) - 1]),
        },
    )


def jsonl_records(path: Path, what: str) -> Iterator[tuple[str, Any]]:
    """A user's JSONL file of `what` (conversations, pairs) as (`path:line`, record) for each non-empty line, so
    a bad record's error names its line; a missing file, a line that is not JSON, or a file without records is a
    ConfigError."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file (expected JSONL {what}, one per line)")
    found = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{path}:{n}: not JSON: {e}") from None
        found = True
        yield f"{path}:{n}", record
    if not found:
        raise ConfigError(f"{path}: no {what}")


def load_conversations(path: str | Path) -> list[list[Message]]:
    """Conversations from a JSONL file: one per line, `{"messages": [...]}` (chat format, as tinker-cookbook's
    supervised datasets) or a bare list of messages. A bad line is a ConfigError naming it."""
    out = []
    for where, row in jsonl_records(Path(path), "conversations"):
        messages = row.get("messages") if isinstance(row, dict) else row
        if (
            not isinstance(messages, list)
            or not all(isinstance(m, dict) and "role" in m for m in messages)
            or not any(m["role"] == "assistant" for m in messages)
        ):
            raise ConfigError(
                f'{where}: expected {{"messages": [{{"role": ..., "content": ...}}, ...]}} with an assistant turn'
            )
        out.append(messages)
    return out


async def train_supervised(
    tc,
    datums: list[types.Datum],
    steps: int,
    batch_size: int,
    adam: types.AdamParams,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """`steps` cross_entropy steps on batches drawn from `datums` (a fresh permutation per pass); returns
    each step's metrics: `sft/nll` (mean over weighted tokens), `sft/tokens`, `sft/grad_norm`."""
    if not datums:
        raise ConfigError("supervised training needs at least one example")
    rng = np.random.default_rng([seed, 0x5F7])
    order: list[int] = []
    history = []
    bar = progress_bar(steps, "supervised", unit="step")
    for step in range(steps):
        batch = []
        while len(batch) < min(batch_size, len(datums)):
            if not order:
                order = list(rng.permutation(len(datums)))
            batch.append(datums[order.pop()])
        fwd_future = tc.forward_backward(batch, "cross_entropy")
        optim_future = tc.optim_step(adam)
        fwd, opt = await fwd_future, await optim_future
        n = sum(sum(d.loss_fn_inputs["weights"].data) for d in batch)
        loss = float((fwd.metrics or {}).get("loss:sum", 0.0))
        m = {
            "sft/nll": loss / max(n, 1.0),
            "sft/tokens": float(n),
            "sft/grad_norm": float((opt.metrics or {}).get("grad_norm:mean", float("nan"))),
        }
        history.append(m)
        bar.update(1)
        bar.set_postfix(nll=f"{m['sft/nll']:.3f}")
        if on_step is not None:
            on_step(step, m)
    bar.close()
    return history

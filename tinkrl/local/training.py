"""LoRA training on the embedded engine: the state one training client owns, and its math.

A `Trainer` holds a LoRA tree that shares the engine's base weights, its trainable parameters,
AdamW and the step count. Its methods run on the engine thread (the TrainingClient submits
them there), so they never race with sampling or with each other. forward/backward packs
datums that share a prefix so it runs once (packing.py; on CPU), runs micro-batches of a
bounded padded size (one holding a long episode recomputes its layers in the backward, and one
longer than this machine holds is refused before any work: the plan's limits), and computes every
position's target logprob with the exact fp32 head where a loss can be non-zero and the
compute-dtype head, once per distinct (hidden state, target), where none can, a chunk of positions
at a time (logprobs.py).
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tinker import types

from tinkrl.allocator import release_free_memory
from tinkrl.local import losses
from tinkrl.local.checkpoints import read_lora, read_meta, read_optimizer, write_checkpoint
from tinkrl.local.compute_plan import MICROBATCH_TOKENS, ComputePlan
from tinkrl.local.engine import Engine, Snapshot
from tinkrl.local.logprobs import target_logprobs, token_logprobs
from tinkrl.local.lora import LORA_ALPHA, LoraSpec
from tinkrl.local.packing import (
    MIN_SHARED,
    Pack,
    batch_packs,
    pack_sequences,
    pack_tensors,
    plain_causal,
    shared_opening,
)
from tinkrl.local.transformer import compile_layers

# With compile=True: one fused pass per row instead of logsumexp's several memory-bound passes
# over [tokens, vocab] temporaries.
compiled_token_logprobs = torch.compile(token_logprobs, dynamic=True)


@dataclass
class _Forwarded:
    """A training micro-batch's final hidden states [B, S, d] and where each datum's positions lie."""

    hidden: torch.Tensor
    members: list[tuple[int, int, list[int]]]  # (datum index, pack row, the datum's positions in that row)
    shared: int  # leading positions every row shares (run once; identical in every row)
    recomputed: bool = False  # its layers recompute in the backward (a long episode)

    def sizes(self) -> list[int]:
        """Each member datum's number of positions, in member order."""
        return [len(idx) for _, _, idx in self.members]

    def coordinates(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, position) of every datum position, members in order."""
        rows = [r for _, r, idx in self.members for _ in idx]
        cols = [c for _, _, idx in self.members for c in idx]
        dev = self.hidden.device
        return torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)


def _loss_inputs(data: list[types.Datum]) -> list[dict[str, torch.Tensor]]:
    """Each datum's `loss_fn_inputs` as tensors, checked to be as long as its model input."""
    inputs = []
    for i, d in enumerate(data):
        n = d.model_input.length
        tensors = {k: v.to_torch() for k, v in d.loss_fn_inputs.items()}
        for k, t in tensors.items():
            if t.shape[0] != n:
                raise losses.LossInputError(
                    f"datum {i}: loss_fn_inputs[{k!r}] has length {t.shape[0]} but "
                    f"model_input has {n} tokens (targets are inputs shifted by one)"
                )
        inputs.append(tensors)
    return inputs


def check_fits(micro_batch: list[Pack], plan: ComputePlan) -> None:
    """Raise a clear `LossInputError` when a training micro-batch (rows x their longest) has more tokens
    than `plan.train_tokens`, the most this machine holds with every layer recomputed."""
    tokens = len(micro_batch) * max(len(p.tokens) for p in micro_batch)
    if plan.train_tokens and tokens > plan.train_tokens:
        datums = sorted(i for p in micro_batch for i, _ in p.members)
        what = f"datum {datums[0]}" if len(datums) == 1 else f"datums {datums[0]}..{datums[-1]} (packed together)"
        raise losses.LossInputError(
            f"{what}: {tokens} tokens, but one training micro-batch fits at most {plan.train_tokens} in this "
            f"{plan.device}'s memory, layers recomputed: shorten the episodes (max_tokens, turns) or train "
            "on a machine with more memory"
        )


class Trainer:
    """One LoRA training run on an engine: its tree, trainable parameters, AdamW and step.

    Every method runs on the engine thread; build one there too (`engine.submit(Trainer, ...)`).
    """

    def __init__(self, engine: Engine, spec: LoraSpec, seed: int | None, compile: bool = False):
        self.engine = engine
        self.spec, self.seed = spec, seed
        self.run_id = f"local-{uuid.uuid4().hex[:12]}"
        self.model = engine.lora_tree(spec, seed)
        if compile:
            compile_layers(self.model)
        self.params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(
            self.params.values(), lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0
        )
        self.step = 0
        self.user_metadata: dict[str, str] = {}  # the run's metadata, kept with every checkpoint
        self._snapshot_seq = itertools.count()

    def snapshot(self) -> Snapshot:
        """A frozen copy of the current adapter weights, for a sampling client."""
        lora = {n: p.detach().clone() for n, p in self.params.items()}
        return Snapshot(f"{self.run_id}:{next(self._snapshot_seq)}", lora, self.spec)

    # -- forward / backward ---------------------------------------------------------------------
    def _hidden_states(
        self, data: list[types.Datum], grad: bool, max_tokens: int | None = None
    ) -> Iterator[_Forwarded]:
        """Yield each micro-batch as a `_Forwarded`, shared prefixes run once (packing.py).

        On CUDA nothing is packed and micro-batches are larger: there the extra launches of packed
        attention and of the two-pass shared opening cost more than the tokens they save.
        """
        seqs = [d.model_input.to_ints() for d in data]
        plan, cuda = self.engine.plan, self.engine.device.type == "cuda"
        max_tokens = max_tokens or MICROBATCH_TOKENS["cuda" if cuda else "cpu"]
        packs = pack_sequences(seqs, min_shared=1 << 30 if cuda else MIN_SHARED, max_tokens=max_tokens)
        batches = batch_packs(packs, max_tokens)
        if grad:  # before any work: a micro-batch this machine cannot hold is one clear error, not an OOM kill
            for mb in batches:
                check_fits(mb, plan)
        for mb in batches:
            # Packs of different prompts still open alike (the chat template's system turn): run that once.
            shared = 0 if cuda else shared_opening(mb)
            # whole sequences alone need no [S, S] mask: causal attention, less memory and time for a long datum
            ids, positions, mask = pack_tensors(mb, self.engine.device, with_mask=bool(shared) or not plain_causal(mb))
            long_row, many = 0 < plan.recompute_row < ids.shape[-1], 0 < plan.recompute_tokens < ids.numel()
            recompute = grad and (long_row or many)
            with torch.set_grad_enabled(grad):
                if shared:
                    hidden = self.model.forward_shared_prefix(ids, positions, mask, shared, recompute=recompute)
                else:
                    hidden = self.model(ids, positions, mask, recompute=recompute)
            yield _Forwarded(hidden, [(i, r, idx) for r, p in enumerate(mb) for i, idx in p.members], shared, recompute)

    def _logprobs(self, fwd: _Forwarded, targets: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Target logprobs of every position of the micro-batch's datums, in member order: the exact
        fp32 head where the loss can be non-zero; elsewhere (no loss, no gradient) the faster
        compute-dtype head, without grad, once per distinct (hidden state, target)."""
        rows, cols = fwd.coordinates()
        lp = fwd.hidden.new_zeros(targets.shape[0])
        idle = ~active
        select = compiled_token_logprobs if self.model.compiled else token_logprobs
        V = self.model.config.vocab_size
        if bool(idle.any()):
            with torch.no_grad():
                # A group's datums repeat their prompt's positions (one pack row), and every row
                # repeats the shared opening (row 0 holds it): most of a GRPO batch's idle positions.
                S = fwd.hidden.shape[1]
                r, c, t = torch.where(cols[idle] < fwd.shared, 0, rows[idle]), cols[idle], targets[idle]
                keys, inverse = torch.unique((r * S + c) * V + t, return_inverse=True)
                r, c, t = keys // V // S, keys // V % S, keys % V
                fast = lambda h: self.model.logits(h, exact=False)  # noqa: E731
                lp[idle] = target_logprobs(fast, fwd.hidden[r, c].detach(), t, V, select)[inverse]
        if bool(active.any()):
            h = fwd.hidden[rows[active], cols[active]]
            lp = lp.index_put((active,), target_logprobs(self.model.logits, h, targets[active], V, select))
        return lp

    def forward_backward(
        self, data: list[types.Datum], loss_fn: str, config: dict | None, backward: bool
    ) -> types.ForwardBackwardOutput:
        """Per-datum logprobs and the summed loss; with `backward`, gradients accumulate into the adapter."""
        if not data:
            raise losses.LossInputError("forward_backward needs at least one datum")
        for i, d in enumerate(data):  # every datum, so a later one missing a key is a clear error too
            try:
                losses.check_loss(loss_fn, config, set(d.loss_fn_inputs))
            except losses.LossInputError as e:
                raise losses.LossInputError(f"datum {i}: {e}" if i else str(e)) from None
        inputs = _loss_inputs(data)
        out_lp: list[torch.Tensor | None] = [None] * len(data)
        total = 0.0
        dev = self.engine.device
        for fwd in self._hidden_states(data, grad=backward):
            with torch.set_grad_enabled(backward):
                dev_inputs = [{k: v.to(dev) for k, v in inputs[i].items()} for i, _, _ in fwd.members]
                # One head pass over every datum of the micro-batch, then each datum's loss.
                targets = torch.cat([d["target_tokens"].long() for d in dev_inputs])
                active = torch.cat([losses.active_positions(loss_fn, d) for d in dev_inputs])
                all_lps = self._logprobs(fwd, targets, active)
                sizes = fwd.sizes()
                loss = torch.zeros((), device=dev)
                for lp, d in zip(all_lps.split(sizes), dev_inputs):
                    loss = loss + losses.datum_loss(loss_fn, lp, d, config)
                # one device-to-host copy per micro-batch (a copy per datum is a sync each on CUDA)
                for (i, _, _), lp in zip(fwd.members, all_lps.detach().float().cpu().split(sizes)):
                    out_lp[i] = lp
            if backward and loss.requires_grad:
                loss.backward()
            total += float(loss.detach())
            if fwd.recomputed:  # a long episode's freed activations go back to the system, not to the next one's peak
                del fwd, all_lps, loss
                release_free_memory()
        outputs = [{"logprobs": types.TensorData.from_torch(lp)} for lp in out_lp]
        return types.ForwardBackwardOutput(
            loss_fn_output_type=loss_fn, loss_fn_outputs=outputs, metrics={"loss:sum": total}
        )

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: Callable) -> types.ForwardBackwardOutput:
        """Backward through the user's `loss_fn(data, logprobs_list) -> (loss, metrics)`, as in the SDK."""
        inputs = _loss_inputs(data)
        lps: list[torch.Tensor | None] = [None] * len(data)
        for fwd in self._hidden_states(data, grad=True, max_tokens=1 << 30):  # one graph for the user's loss
            targets = torch.cat([inputs[i]["target_tokens"].long() for i, _, _ in fwd.members]).to(fwd.hidden.device)
            all_lps = self._logprobs(fwd, targets, torch.ones_like(targets, dtype=torch.bool))
            for (i, _, _), lp in zip(fwd.members, all_lps.split(fwd.sizes())):
                lps[i] = lp
        # As the SDK does: the user's loss sees CPU tensors (whatever the device), and its gradient
        # with respect to them flows back into the model.
        host = [lp.detach().cpu().requires_grad_() for lp in lps]
        loss, metrics = loss_fn(data, host)
        loss.backward()
        torch.autograd.backward(
            lps, [h.grad.to(lp.device) if h.grad is not None else torch.zeros_like(lp) for h, lp in zip(host, lps)]
        )
        outputs = [{"logprobs": types.TensorData.from_torch(lp.detach())} for lp in host]
        return types.ForwardBackwardOutput(
            loss_fn_output_type="custom",
            loss_fn_outputs=outputs,
            metrics={"loss:sum": float(loss.detach()), **dict(metrics or {})},
        )

    # -- optimizer ------------------------------------------------------------------------------
    def optim_step(self, p: types.AdamParams) -> types.OptimStepResponse:
        """One AdamW step with Tinker's AdamParams (grad norm clipped when asked, always reported)."""
        for group in self.optimizer.param_groups:
            group.update(lr=p.learning_rate, betas=(p.beta1, p.beta2), eps=p.eps, weight_decay=p.weight_decay)
        grads = [q for q in self.params.values() if q.grad is not None]
        clip = p.grad_clip_norm if p.grad_clip_norm and p.grad_clip_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(grads, clip)) if grads else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return types.OptimStepResponse(
            metrics={"grad_norm:mean": norm, "learning_rate:mean": p.learning_rate, "step:max": float(self.step)}
        )

    # -- checkpoints ------------------------------------------------------------------------------
    def save_state(self, name: str) -> types.SaveWeightsResponse:
        """Weights and optimizer state, for resuming."""
        return types.SaveWeightsResponse(path=self._write("weights", name, True))

    def save_weights_for_sampler(self, name: str) -> types.SaveWeightsForSamplerResponse:
        """Weights only, for sampling or export."""
        return types.SaveWeightsForSamplerResponse(path=self._write("sampler_weights", name, False))

    def _write(self, kind: str, name: str, with_optimizer: bool) -> str:
        s = self.spec
        meta = {
            "base_model": self.engine.model_name,
            "lora": {
                "rank": s.rank,
                "seed": self.seed,
                "train_mlp": s.train_mlp,
                "train_attn": s.train_attn,
                "train_unembed": s.train_unembed,
            },
            "step": self.step,
            "kind": kind,
            "run_id": self.run_id,
            "lora_alpha": LORA_ALPHA,
            "user_metadata": self.user_metadata,
        }
        lora = {n: p.detach().contiguous().cpu() for n, p in self.params.items()}
        return write_checkpoint(name, meta, lora, self.optimizer.state_dict() if with_optimizer else None)

    def load(self, ckpt: Path, with_optimizer: bool) -> None:
        """Take the adapter weights, the step and (`with_optimizer`) AdamW's state from a checkpoint."""
        state = read_lora(ckpt)
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(state[n].to(p.device))
        if with_optimizer:
            self.optimizer.load_state_dict(read_optimizer(ckpt, self.engine.device))
        meta = read_meta(ckpt)
        self.step = meta.get("step", 0)
        self.user_metadata = dict(meta.get("user_metadata") or {})

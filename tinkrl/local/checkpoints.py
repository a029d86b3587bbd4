"""Checkpoints on disk: where they live, writing and reading them, and exporting them for serving.

A checkpoint is a directory `$TINKRL_HOME/checkpoints/<run_id>/{weights,sampler_weights}/<name>`,
addressed as `tinker://<run_id>/{weights,sampler_weights}/<name>` (an absolute directory path
works too). It holds tinkrl's own files (`lora.safetensors`, `optimizer.pt` for `weights`,
`tinkrl_meta.json`) and is also a valid PEFT adapter (`adapter_config.json` +
`adapter_model.safetensors`), loadable with `peft.PeftModel.from_pretrained` over the base
transformers model; `export_checkpoint` copies that adapter out, or writes a merged HF model.
`tinkrl_meta.json` is written last, so a directory that has it is complete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tinkrl.errors import TinkrlError
from tinkrl.local.checkpoint_paths import META, checkpoint_dir
from tinkrl.local.checkpoint_paths import checkpoints_root as _root
from tinkrl.local.lora import LoraSpec
from tinkrl.local.models import load_model, load_tokenizer


class CheckpointNotFound(TinkrlError):
    """A checkpoint path that names no checkpoint, or a checkpoint without the state asked for."""


def resolve_path(path: str) -> Path:
    """`tinker://<run>/<kind>/<name>` or an absolute directory -> the checkpoint directory (the path map of
    `checkpoint_paths.checkpoint_dir`), which must hold a complete checkpoint."""
    local = checkpoint_dir(path)
    if not (local / META).is_file():
        raise CheckpointNotFound(f"checkpoint {path!r} not found (looked for {local}/{META})")
    return local


def write_checkpoint(name: str, meta: dict, lora: dict[str, torch.Tensor], optimizer_state: dict | None = None) -> str:
    """Write checkpoint `name` of run `meta["run_id"]`, kind `meta["kind"]`; return its tinker:// path.

    `lora`: the adapter tensors on the CPU; `optimizer_state`: the optimizer's state dict, or
    None (sampler weights hold none).
    """
    from safetensors.torch import save_file

    run_id, kind = meta["run_id"], meta["kind"]
    out = _root() / run_id / kind / name
    out.mkdir(parents=True, exist_ok=True)
    (out / META).unlink(missing_ok=True)  # saved again under this name: incomplete until its new META is written
    save_file(lora, out / "lora.safetensors")
    if optimizer_state is not None:
        torch.save(optimizer_state, out / "optimizer.pt")
    _write_peft_adapter(out, lora, meta)
    (out / META).write_text(json.dumps(meta, indent=2))
    return f"tinker://{run_id}/{kind}/{name}"


def read_meta(ckpt: Path) -> dict:
    """A checkpoint directory's `tinkrl_meta.json`: base_model, lora, step, kind, run_id, lora_alpha,
    user_metadata."""
    return json.loads((ckpt / META).read_text())


def read_lora(ckpt: Path) -> dict[str, torch.Tensor]:
    """The adapter tensors (our module tree's names), on the CPU."""
    from safetensors.torch import load_file

    return load_file(ckpt / "lora.safetensors")


def read_optimizer(ckpt: Path, device: torch.device) -> dict:
    """The optimizer's state dict, its tensors on `device`."""
    opt = ckpt / "optimizer.pt"
    if not opt.is_file():
        raise CheckpointNotFound(f"{ckpt} holds no optimizer state (saved with save_weights_for_sampler?)")
    return torch.load(opt, map_location=device)


def _peft_key(name: str) -> str:
    # our tree: model.layers.0.self_attn.q_proj.lora_A.default.weight -> PEFT's on-disk key
    return "base_model.model." + name.replace(".default.", ".")


def _write_peft_adapter(out: Path, lora: dict[str, torch.Tensor], meta: dict) -> None:
    from peft import LoraConfig
    from safetensors.torch import save_file

    LoraConfig(
        r=meta["lora"]["rank"],
        lora_alpha=meta["lora_alpha"],
        lora_dropout=0.0,
        target_modules=LoraSpec.from_meta(meta["lora"]).targets(),
        task_type="CAUSAL_LM",
        base_model_name_or_path=meta["base_model"],
    ).save_pretrained(out)
    save_file({_peft_key(k): v for k, v in lora.items()}, out / "adapter_model.safetensors")


def export_checkpoint(path: str, out: Path, merged: bool) -> Path:
    """Write a PEFT adapter dir (default) or a merged transformers model dir to `out`."""
    ckpt = resolve_path(path)
    meta = read_meta(ckpt)
    out.mkdir(parents=True, exist_ok=True)
    if not merged:
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy2(ckpt / f, out / f)
        return out
    from peft import PeftModel

    # load_model, not from_pretrained: the tiny test models exist only in memory (no model directory)
    model = load_model(meta["base_model"], torch.device("cpu"), torch.float32).model
    if meta["lora"]["train_unembed"] and model.config.tie_word_embeddings:
        # A trained unembedding must not silently change the input embeddings: untie first.
        model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
        model.config.tie_word_embeddings = False
    model = PeftModel.from_pretrained(model, ckpt).merge_and_unload()
    model.save_pretrained(out)
    load_tokenizer(meta["base_model"]).save_pretrained(out)
    return out

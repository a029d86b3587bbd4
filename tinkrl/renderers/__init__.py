"""Chat messages <-> tokens, stop tokens, and tool-call parsing per model family.

One interface (`Renderer`, base.py) used by environments, the trainer and the servers; one
registry of names (`names.py`): tinker-cookbook's renderer names, tinkrl's earlier names as
aliases. Where tml-renderers (Thinking Machines' renderers, tokenizers built in) ships a family,
it is the implementation (`tml.py`: Qwen3, Qwen3.5/3.6, Qwen3.8, DeepSeek V3.1/V4.1, GLM-5.3,
gpt-oss, Kimi K2/K2.5/K2.6, Nemotron 3, TML v0); the formats it lacks are written by hand:
`llama3.py` (Llama 3 Instruct), `role_colon.py` (base models), `chatml.py` (ChatML, SmolLM2, Qwen2.5).

A model name gets tinker-cookbook's recommended renderer (`names.recommend`), `renderer=NAME`
overrides it, and `thinking=false|true` picks the family's variant (`choose_renderer`). A name no
rule knows renders as ChatML only when its tokenizer has ChatML's tokens (`names.is_chatml`, the
one test, in a run's plan and here); otherwise the caller is told to choose one.

Messages are OpenAI-style dicts: {"role", "content", "tool_calls"?: [{"id", "type": "function",
"function": {"name", "arguments": JSON string}}], "tool_call_id"?, "name"? (tool results),
"reasoning_content"? (a reply's thinking)}.

Importing this package imports nothing heavy (no torch, transformers or tml_renderers): the
`--dry-run` plan names the renderer before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Message, ParsedResponse, Renderer, parse_text_calls, tool_call
from .chatml import ChatMLRenderer
from .hosted_models import HOSTED_MODELS, hosted_model
from .llama3 import Llama3Renderer
from .names import (
    ALIASES,
    RENDERER_NAMES,
    RENDERERS,
    canonical,
    choose_renderer,
    is_chatml,
    names_help,
    recommend,
    renderer_name_for,
    tokenizer_family,
    tool_format_problem,
)
from .role_colon import RoleColonRenderer

__all__ = [
    "ALIASES",
    "HOSTED_MODELS",
    "RENDERERS",
    "RENDERER_NAMES",
    "ChatMLRenderer",
    "Llama3Renderer",
    "Message",
    "ParsedResponse",
    "Renderer",
    "RoleColonRenderer",
    "bundled_tokenizer",
    "canonical",
    "choose_renderer",
    "get_renderer",
    "hosted_model",
    "is_chatml",
    "load_tokenizer",
    "parse_text_calls",
    "recommend",
    "renderer_name_for",
    "tool_call",
    "tokenizer_family",
    "tool_format_problem",
]

# Default system prompts the ChatML families' own chat templates insert when none is given.
_DEFAULT_SYSTEM = {
    "smollm2": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "qwen2": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
}
# What a model's tokenizer may fail with when it is neither on disk nor reachable.
_UNREACHABLE = (OSError, RuntimeError, ValueError)

Tokenizer = Any
TokenizerSource = Tokenizer | Callable[[], Tokenizer] | None


def _materialize(source: TokenizerSource) -> tuple[Tokenizer | None, Exception | None]:
    """A tokenizer from a tokenizer or a zero-argument loader: (tokenizer, None) or (None, why not)."""
    if source is None or hasattr(source, "encode"):
        return source, None
    try:
        return source(), None
    except _UNREACHABLE as e:
        return None, e


def bundled_tokenizer(model_name: str, name: str | None = None) -> Tokenizer | None:
    """The tokenizer tml-renderers bundles for the renderer `name` (else the model's own renderer), or for
    a hosted base model its family's; None when neither has one (Llama, ChatML models)."""
    chosen = name or renderer_name_for(model_name)
    spec = RENDERERS[canonical(chosen)] if chosen else None
    hosted = hosted_model(model_name)
    if spec is not None and spec.tml is not None:
        from .tml import bundled_tokenizer_of

        return bundled_tokenizer_of(spec.tml)
    if hosted is not None and hosted.tokenizer:
        from tml_renderers import tokenizers

        from .bundled_tokenizers import BundledTokenizer

        return BundledTokenizer(getattr(tokenizers, hosted.tokenizer)(), model_name)
    return None


def load_tokenizer(model_name: str, name: str | None = None) -> Tokenizer:
    """The tokenizer to render `model_name` with: the model's own (on disk, in the HF cache, or downloaded
    once), else, when that cannot be had (offline), the one tml-renderers bundles for its family."""
    from tinkrl.local.models import ModelNotFoundError
    from tinkrl.local.models import load_tokenizer as load_model_tokenizer

    try:
        return load_model_tokenizer(model_name)
    except (ModelNotFoundError, OSError):  # not on disk, and the hub cannot be reached
        bundled = bundled_tokenizer(model_name, name)
        if bundled is None:
            raise
        return bundled


def get_renderer(
    tokenizer: TokenizerSource, model_name: str, tool_format: str = "hermes", name: str | None = None
) -> Renderer:
    """The renderer for a model: `name` (any of RENDERER_NAMES) if given, else the model's (`recommend`).

    `tokenizer` is the model's tokenizer, or a zero-argument function that loads it (a training
    client's `get_tokenizer`), or None. tml-renderers families render with the tokenizer they bundle
    and only check the model's against it (a loader that cannot reach the hub is skipped); the
    hand-written families render with the model's. A model no rule names gets ChatML when its
    tokenizer has `<|im_end|>`; otherwise this raises ValueError naming the model and the choices.
    """
    chosen = canonical(name) if name else renderer_name_for(model_name)
    spec = RENDERERS[chosen] if chosen else None
    if spec is not None and spec.tml is not None:
        from .tml import TmlRenderer

        model_tokenizer, _ = _materialize(tokenizer)
        return TmlRenderer(spec, model_tokenizer, tool_format)
    model_tokenizer, error = _materialize(tokenizer)
    if model_tokenizer is None:
        raise ValueError(f"no tokenizer for model {model_name!r}: {error or 'none given'}")
    if spec is None:
        if not is_chatml(model_name, model_tokenizer):
            raise ValueError(
                f"no renderer for model {model_name!r}: no rule names its family and its tokenizer has no "
                f"<|im_end|> (not ChatML). Choose one with renderer=NAME: {names_help()}"
            )
        spec = RENDERERS["chatml"]
    if spec.hand == "llama3":
        return Llama3Renderer(model_tokenizer, None, tool_format)
    if spec.hand == "role_colon":
        return RoleColonRenderer(model_tokenizer, None, tool_format)
    return ChatMLRenderer(model_tokenizer, _DEFAULT_SYSTEM.get(spec.name), tool_format, name=spec.name)

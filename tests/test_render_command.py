"""Which renderer a model gets, as a user sees it: `tinkrl train --dry-run` for every model hosted
Tinker serves names tinker-cookbook's first recommendation (this test keeps its own copy of the
cookbook's model_info), a model no rule names is a plan problem listing the choices, and `tinkrl
render` prints the prompt tokens a sampler gets, offline, as the README's table shows them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.chat_tokenizers import llama3_tokenizers, missing
from helpers.requirements import unless

from tinkrl import renderers
from tinkrl.cli import main as tinkrl
from tinkrl.renderers import RENDERERS, get_renderer

ROOT = Path(__file__).resolve().parents[1]
NO_LLAMA = missing("llama_models", "tiktoken")

# tinker-cookbook 0.5.8, tinker_cookbook/model_info.py: each model's first recommended renderer
COOKBOOK_FIRST = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama3",
    "meta-llama/Llama-3.2-1B": "role_colon",
    "meta-llama/Llama-3.2-3B": "role_colon",
    "meta-llama/Llama-3.1-8B": "role_colon",
    "meta-llama/Llama-3.1-70B": "role_colon",
    "meta-llama/Llama-3.3-70B-Instruct": "llama3",
    "Qwen/Qwen3-VL-30B-A3B-Instruct": "qwen3_vl_instruct",
    "Qwen/Qwen3-VL-235B-A22B-Instruct": "qwen3_vl_instruct",
    "Qwen/Qwen3-8B-Base": "role_colon",
    "Qwen/Qwen3-30B-A3B-Base": "role_colon",
    "Qwen/Qwen3-8B": "qwen3",
    "Qwen/Qwen3-32B": "qwen3",
    "Qwen/Qwen3-30B-A3B": "qwen3",
    "Qwen/Qwen3-4B-Instruct-2507": "qwen3_instruct",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3_instruct",
    "Qwen/Qwen3-235B-A22B-Instruct-2507": "qwen3_instruct",
    "Qwen/Qwen3.5-4B": "qwen3_5",
    "Qwen/Qwen3.5-9B": "qwen3_5",
    "Qwen/Qwen3.5-9B-Base": "role_colon",
    "Qwen/Qwen3.5-27B": "qwen3_5",
    "Qwen/Qwen3.5-35B-A3B": "qwen3_5",
    "Qwen/Qwen3.5-35B-A3B-Base": "role_colon",
    "Qwen/Qwen3.5-397B-A17B": "qwen3_5",
    "Qwen/Qwen3.6-27B": "qwen3_5",
    "Qwen/Qwen3.6-35B-A3B": "qwen3_5",
    "Qwen/Qwen3.8-27B": "qwen3_8_xhigh_reasoning",
    "deepseek-ai/DeepSeek-V3.1": "deepseekv3",
    "deepseek-ai/DeepSeek-V3.1-Base": "role_colon",
    "deepseek-ai/DeepSeek-V4.1-Flash": "deepseekv4_1",
    "deepseek-ai/DeepSeek-V4.1-Flash-1017": "deepseekv4_1",
    "openai/gpt-oss-20b": "gpt_oss_no_sysprompt",
    "openai/gpt-oss-120b": "gpt_oss_no_sysprompt",
    "moonshotai/Kimi-K2-Thinking": "kimi_k2",
    "moonshotai/Kimi-K2.5": "kimi_k25",
    "moonshotai/Kimi-K2.6": "kimi_k26",
    "zai-org/GLM-5.3": "glm5_3_max_reasoning",
    "zai-org/GLM-5.3-Flash": "glm5_3_max_reasoning",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "nemotron3",
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": "nemotron3",
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": "nemotron3_ultra",
    "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16": "nemotron3_ultra",
    "nvidia/NVIDIA-Nemotron-3.5-Super-VL-120B-A12B-BF16": "nemotron3_ultra",
    "thinkingmachines/Inkling": "tml_v0",
    "thinkingmachines/Inkling-Small": "tml_v0",
}


@pytest.fixture(autouse=True)
def offline(monkeypatch, isolated_home):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")


def dry_run(capsys, *args: str) -> dict:
    assert tinkrl(["train", "env=arithmetic", *args, "--dry-run"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_test_copy_has_all_44_hosted_models():
    assert len(COOKBOOK_FIRST) == 44


@pytest.mark.parametrize("model,expected", COOKBOOK_FIRST.items())
def test_dry_run_names_the_cookbooks_renderer_for_every_hosted_model(capsys, monkeypatch, model, expected):
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")  # a new user's setup: the model trains on the service
    plan = dry_run(capsys, f"model_name={model}")
    assert (plan["renderer"], plan["backend"], plan["problems"]) == (expected, "tinker", [])
    assert plan["renderer_reason"] == "tinker-cookbook's recommendation for this model"


def test_thinking_and_renderer_override_show_in_the_plan(capsys):
    plan = dry_run(capsys, "model_name=Qwen/Qwen3.5-4B", "thinking=false", "backend=tinker")
    assert plan["renderer"] == "qwen3_5_disable_thinking" and plan["renderer_reason"].endswith("thinking=false")
    plan = dry_run(capsys, "model_name=Qwen/Qwen3.5-4B", "renderer=qwen3_5_preserve_thinking", "backend=tinker")
    assert (plan["renderer"], plan["renderer_reason"]) == ("qwen3_5_preserve_thinking", "set in the config")


def test_a_model_no_rule_names_is_a_plan_problem_listing_the_choices(capsys, tmp_path):
    plan = dry_run(capsys, "model_name=acme/mystery-7b", "backend=tinker")
    [problem] = plan["problems"]
    assert plan["renderer"] is None and "acme/mystery-7b" in problem and "renderer=NAME" in problem
    assert "qwen3_5" in problem and "role_colon" in problem and "\n" not in problem
    assert tinkrl(["train", "env=arithmetic", "model_name=acme/mystery-7b", "backend=tinker"]) == 2
    assert "no renderer for model 'acme/mystery-7b'" in capsys.readouterr().err
    # a local model whose tokenizer is ChatML renders as ChatML
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}')
    plan = dry_run(capsys, f"model_name={model}", "backend=tinker")
    assert plan["renderer"] == "chatml" and plan["problems"] == []


def write_gguf(path, tokens: list[str], **general: str) -> str:
    """A GGUF file holding only metadata: `general.*` fields and a vocabulary."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in general.items():
        writer.add_string(f"general.{key}", value)
    writer.add_token_list(tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_a_gguf_file_gets_the_renderer_its_metadata_or_its_vocabulary_names(capsys, tmp_path):
    """The plan and `get_renderer` come to one answer for a `.gguf` path: the rule for the name the
    file gives itself, else ChatML when its vocabulary has `<|im_end|>`, else a plan problem."""
    from tinkrl.renderers import choose_renderer, is_chatml

    named = write_gguf(tmp_path / "named.gguf", ["a", "<|im_end|>"], basename="Qwen2.5-Coder", size_label="0.5B",
                       finetune="Instruct")  # fmt: skip
    plan = dry_run(capsys, f"model_name={named}", "backend=tinker")
    assert plan["renderer"] == "qwen2" and "names itself Qwen/Qwen2.5-Coder-0.5B-Instruct" in plan["renderer_reason"]
    nameless = write_gguf(tmp_path / "nameless.gguf", ["a", "<|im_start|>", "<|im_end|>"])
    plan = dry_run(capsys, f"model_name={nameless}", "backend=tinker")
    assert (plan["renderer"], plan["problems"]) == ("chatml", []) and "ChatML" in plan["renderer_reason"]
    assert choose_renderer(nameless) == "chatml" and is_chatml(nameless)
    other = write_gguf(tmp_path / "other.gguf", ["a", "<|eot_id|>"])
    plan = dry_run(capsys, f"model_name={other}", "backend=tinker")
    assert plan["renderer"] is None and "no renderer for model" in plan["problems"][0]
    assert not is_chatml(other) and choose_renderer(other) is None


def readme_render_section() -> tuple[list[dict], list[tuple[str, str, str]]]:
    """The README's example conversation and its table: (example model, renderer, end of the prompt)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Chat formats (`tinkrl render`)") :]
    section = section[: section.index("\n## ", 10)]
    chat = json.loads(re.search(r"cat > chat.json <<'EOF'\n(.*?)\nEOF", section, re.S).group(1))
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 5 and cells[1].startswith("`") and cells[2].startswith("`"):
            end = cells[4].strip("`").replace("\\|", "|").replace("\\n", "\n")
            rows.append((cells[1].strip("`"), cells[2].strip("`"), end))
    return chat, rows


def test_the_readme_table_has_one_model_per_family():
    _, rows = readme_render_section()
    assert len(rows) == 18 and len({r for _, r, _ in rows}) == 18


ROWS = [
    pytest.param(row, marks=unless(NO_LLAMA) if row[1] == "llama3" else (), id=row[1])
    for row in readme_render_section()[1]
]


# the README's "built by" column, as tml-renderers' own calls
def tml_direct(name: str):
    from tml_renderers import renderers as tml
    from tml_renderers import tokenizers, v0

    return {
        "qwen3": lambda: tml.Qwen3(),
        "qwen3_instruct": lambda: tml.Qwen3.instruct(),
        "qwen3_vl_instruct": lambda: tml.Qwen3.vision_instruct(),
        "qwen3_5": lambda: tml.Qwen35(),
        "qwen3_8_xhigh_reasoning": lambda: tml.Qwen38.xhigh(),
        "deepseekv3": lambda: tml.DeepSeekV31(),
        "deepseekv4_1": lambda: tml.DeepSeekV41(),
        "glm5_3_max_reasoning": lambda: tml.Glm53(clear_thinking=False),
        "gpt_oss_no_sysprompt": lambda: tml.GptOss(),
        "kimi_k2": lambda: tml.KimiK2(),
        "kimi_k25": lambda: tml.KimiK25(),
        "kimi_k26": lambda: tml.KimiK25(),
        "nemotron3": lambda: tml.Nemotron3(),
        "nemotron3_ultra": lambda: tml.Nemotron3.ultra(),
        "tml_v0": lambda: v0.Renderer(tokenizers.O200kBaseChatTokenizer()),
    }[name]()


def expected_prompt(name: str, model: str, chat: list[dict]) -> list[int]:
    """The prompt of `chat` from each family's own reference: tml-renderers called directly (gpt-oss without
    harmony's system message), the model's HF chat template (SmolLM2), Meta's ChatFormat (Llama 3), the
    cookbook's role_colon pieces, each encoded alone."""
    if RENDERERS[name].tml is not None:
        from tml_renderers import chat as tml_chat

        spans, _ = tml_direct(name).render_for_completion(tml_chat.OpenAIMessage.from_oss_messages(chat))
        tokens = [t for s in spans for t in s.span.tokens]
        if name == "gpt_oss_no_sysprompt":  # everything after harmony's system message
            end = get_renderer(None, model).tokenizer.convert_tokens_to_ids("<|end|>")
            tokens = tokens[tokens.index(end) + 1 :]
        return tokens
    system, user = chat[0]["content"], chat[1]["content"]
    if name == "llama3":
        from llama_models.datatypes import RawMessage
        from llama_models.llama3.chat_format import ChatFormat

        preamble = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        dialog = [RawMessage(role="system", content=preamble + system), RawMessage(role="user", content=user)]
        return ChatFormat(llama3_tokenizers()[1]).encode_dialog_prompt(dialog).tokens
    tok = renderers.load_tokenizer(model)
    if name == "smollm2":
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        return tok.encode(text, add_special_tokens=False)
    assert name == "role_colon"
    bos = [tok.bos_token_id] if getattr(tok, "bos_token", None) else []
    pieces = ["System:", f" {system}\n\n", "User:", f" {user}\n\n", "Assistant:"]
    return bos + [t for p in pieces for t in tok.encode(p, add_special_tokens=False)]


@pytest.mark.parametrize("row", ROWS)
def test_tinkrl_render_prints_the_readmes_prompts(row, tmp_path, capsys, monkeypatch):
    model, name, end = row
    if name == "llama3":  # Llama's tokenizer is not bundled: the test reads Meta's from llama-models
        monkeypatch.setattr("tinkrl.renderers.load_tokenizer", lambda *a: llama3_tokenizers()[0])
    chat, _ = readme_render_section()
    (tmp_path / "chat.json").write_text(json.dumps(chat))
    assert tinkrl(["render", model, "--messages", str(tmp_path / "chat.json")]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["renderer"] == name and out["text"].endswith(end)
    assert out["tokens"] == list(expected_prompt(name, model, chat))
    assert "You are terse." in out["text"] and "What is 2+2?" in out["text"]


def test_render_takes_tools_a_renderer_and_tells_bad_input_in_one_line(tmp_path, capsys):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "What is here?"}]}))
    tools = tmp_path / "tools.json"
    schema = {"name": "ls", "description": "List files.", "parameters": {"type": "object", "properties": {}}}
    tools.write_text(json.dumps([{"type": "function", "function": schema}]))
    argv = [
        "render",
        "Qwen/Qwen3.5-4B",
        "--messages",
        str(chat),
        "--tools",
        str(tools),
        "--renderer",
        "qwen3_5_disable_thinking",
    ]
    assert tinkrl(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["renderer"] == "qwen3_5_disable_thinking" and "<function=example_function_name>" in out["text"]
    assert out["tokens"][0] == 248045  # Qwen3.5's own <|im_start|>, not Qwen3's 151644
    assert tinkrl(["render", "Qwen/Qwen3.5-4B", "--messages", str(chat), "--renderer", "vicuna"]) == 2
    assert "unknown renderer 'vicuna'; choose one of: role_colon" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[{")
    assert tinkrl(["render", "Qwen/Qwen3.5-4B", "--messages", str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tinkrl render: error: --messages") and "not JSON" in err and err.count("\n") == 1
    assert tinkrl(["render", "meta-llama/Llama-3.2-1B", "--messages", str(chat)]) == 1  # offline, not on disk
    err = capsys.readouterr().err
    assert "meta-llama/Llama-3.2-1B" in err and err.count("\n") == 1
    nameless = {"id": "c", "type": "function", "function": {"arguments": "{}"}}  # a tool call without a name
    chat.write_text(json.dumps([{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [nameless]}]))
    for model in ("Qwen/Qwen3.5-4B", "openai/gpt-oss-20b"):
        assert tinkrl(["render", model, "--messages", str(chat)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tinkrl render: error: --messages") and "missing 'name'" in err and err.count("\n") == 1


def test_a_tool_format_the_renderer_cannot_write_is_a_plan_problem_and_a_config_error(capsys, tmp_path):
    """A tml-renderers family writes only its own tool calls: tool_format=xml stops the run before any work,
    in one line, both in the plan and where an environment builds its renderer."""

    def plan(*args: str) -> dict:
        assert tinkrl(["train", "env=shell", "env.tool_format=xml", *args, "--dry-run"]) == 0
        return json.loads(capsys.readouterr().out)

    [problem] = plan("model_name=Qwen/Qwen3.5-4B", "backend=tinker")["problems"]
    assert problem == (
        "environments.shell: the qwen3_5 renderer speaks only its family's own tool-call format: "
        "use tool_format=hermes (not tool_format=xml)"
    )
    assert plan("model_name=tinkrl/tiny-llama")["problems"] == []  # ChatML writes R2E-Gym's XML calls
    from tinkrl.config import EnvEntry
    from tinkrl.envs import EnvContext
    from tinkrl.envs.agent_tasks.config import TasksEnvConfig
    from tinkrl.envs.agent_tasks.env import build_datasets as tasks_datasets
    from tinkrl.envs.shell.config import ShellEnvConfig
    from tinkrl.envs.shell.env import build_datasets as shell_datasets
    from tinkrl.errors import ConfigError

    r = get_renderer(None, "Qwen/Qwen3.5-4B")
    for key, build, cfg in [
        ("shell", shell_datasets, ShellEnvConfig(tool_format="xml")),
        ("tasks", tasks_datasets, TasksEnvConfig(path=str(tmp_path / "none"), tool_format="xml")),
    ]:
        ctx = EnvContext(key, EnvEntry(), r, "Qwen/Qwen3.5-4B", 2, 2, 32, tmp_path, seed=0)
        with pytest.raises(ConfigError, match=f"^environments.{key}: the qwen3_5 renderer speaks only its"):
            build(cfg, ctx)  # before loading a task (there are none) or starting a sandbox

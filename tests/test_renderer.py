"""The ChatML renderer: agreement with the model's own HF chat template, the extension property
across turns (prompt + action + continuation), tool-call rendering/parsing round trips in both the
hermes and xml formats, and malformed tool calls as errors (never exceptions)."""

from __future__ import annotations

import json

import pytest

from tinkrl.local.models import DEFAULT_MODEL, load_tokenizer
from tinkrl.renderers import get_renderer, tool_call


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def renderer(tok):
    return get_renderer(tok, DEFAULT_MODEL)


@pytest.fixture(scope="module", params=["hermes", "xml"])
def tool_renderer(request, tok):
    return get_renderer(tok, DEFAULT_MODEL, tool_format=request.param)


CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke.\nPlease, a short one."},
    ],
    [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "12*12"},
        {"role": "assistant", "content": "144"},
        {"role": "user", "content": "  and 13*13?  "},
        {"role": "assistant", "content": "169\n\nDone."},
        {"role": "user", "content": "Thanks 🙂"},
    ],
]


@pytest.mark.parametrize("conv", CONVERSATIONS)
def test_matches_the_hf_chat_template(renderer, tok, conv):
    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    expected = tok.encode(text, add_special_tokens=False)
    assert renderer.build_generation_prompt(conv).to_ints() == expected
    if conv[-1]["role"] == "user":  # whole turns, no generation prompt
        text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=False)
        assert renderer.render_messages(conv) == tok.encode(text, add_special_tokens=False)


def test_stop_sequences_are_im_end(renderer, tok):
    assert renderer.stop_sequences() == [tok.convert_tokens_to_ids("<|im_end|>")]


@pytest.mark.parametrize("ended_cleanly", [True, False])
def test_extension_property_across_turns(tool_renderer, tok, ended_cleanly):
    """prompt_t + action_t + continuation_t is the next prompt, token for token (by construction), and
    it reads exactly as the whole conversation rendered from messages."""
    r = tool_renderer
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "ls", "description": "list files", "parameters": schema}}]
    messages = [{"role": "user", "content": "What files are here?"}]
    prompt = r.build_generation_prompt(messages, tools).to_ints()
    turns = [(tool_call("ls", {"path": "."}), "a.txt\nb.txt"), (tool_call("ls", {"path": "sub"}), "c.txt")]
    for call, result in turns:
        assistant = {"role": "assistant", "content": "Let me look.", "tool_calls": [call]}
        body = r.message_text(assistant)[1]
        action = tok.encode(body, add_special_tokens=False) + ([r.im_end] if ended_cleanly else [])
        cont = r.continuation([{"role": "tool", "content": result, "tool_call_id": call["id"]}], ended_cleanly)
        nxt = prompt + action + cont
        messages = messages + [assistant, {"role": "tool", "content": result}]
        rerendered = r.build_generation_prompt(messages, tools).to_ints()
        assert tok.decode(nxt) == tok.decode(rerendered)
        assert nxt[: len(prompt)] == prompt and "<tool_response>\n" + result in tok.decode(cont)
        prompt = nxt
    # the parsed action gives back the call
    parsed = r.parse_response(action)
    assert parsed.ended_cleanly == ended_cleanly
    assert parsed.message["tool_calls"][0]["function"]["name"] == "ls"


def test_multiple_tool_results_share_one_user_turn(renderer, tok):
    cont = renderer.continuation([{"role": "tool", "content": "one"}, {"role": "tool", "content": "two"}])
    text = tok.decode(cont)
    assert text.count("<|im_start|>user") == 1 and text.endswith("<|im_start|>assistant\n")
    assert "<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response>" in text


@pytest.mark.parametrize(
    "args", [{"path": "src/main.py", "pattern": "def f(x):"}, {"command": "echo 'hi' && ls -la | head -3"}, {}]
)
def test_tool_call_round_trip(tool_renderer, tok, args):
    r = tool_renderer
    calls = [tool_call("search", args), tool_call("execute_bash", {"command": "pwd"})]
    msg = {"role": "assistant", "content": "I will check.", "tool_calls": calls}
    tokens = tok.encode(r.message_text(msg)[1], add_special_tokens=False) + [r.im_end]
    parsed = r.parse_response(tokens)
    assert parsed.ended_cleanly and parsed.tool_call_errors == []
    assert parsed.message["content"] == "I will check."
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.message["tool_calls"]]
    assert got == [("search", args), ("execute_bash", {"command": "pwd"})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in parsed.message["tool_calls"])


def test_hermes_round_trip_keeps_json_types(tok):
    r = get_renderer(tok, DEFAULT_MODEL, tool_format="hermes")
    args = {"n": 3, "flags": ["-a", "-l"], "opts": {"deep": True}, "none": None}
    tokens = tok.encode(
        r.message_text({"role": "assistant", "content": "", "tool_calls": [tool_call("f", args)]})[1],
        add_special_tokens=False,
    )
    parsed = r.parse_response(tokens)
    assert not parsed.ended_cleanly  # no <|im_end|>: cut by max_tokens
    assert json.loads(parsed.message["tool_calls"][0]["function"]["arguments"]) == args


MALFORMED_HERMES = [
    ("<tool_call>\n{not json}\n</tool_call>", "not valid JSON"),
    ('<tool_call>\n{"arguments": {}}\n</tool_call>', "must be an object"),
    ('<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>', "must be a JSON object"),
    ('<tool_call>\n{"name": "f", "arguments": "{oops"}\n</tool_call>', "not a JSON object"),
    ('<tool_call>\n{"name": "f", "arguments": {}}', "not closed"),
]


@pytest.mark.parametrize("text,error", MALFORMED_HERMES)
def test_malformed_hermes_calls_are_errors(tok, text, error):
    r = get_renderer(tok, DEFAULT_MODEL, tool_format="hermes")
    parsed = r.parse_response(tok.encode("Sure. " + text, add_special_tokens=False) + [r.im_end])
    assert "tool_calls" not in parsed.message
    assert len(parsed.tool_call_errors) == 1 and error in parsed.tool_call_errors[0]
    assert parsed.message["content"].startswith("Sure.")


def test_malformed_xml_call_is_an_error(tok):
    r = get_renderer(tok, DEFAULT_MODEL, tool_format="xml")
    parsed = r.parse_response(tok.encode("<function=run>\n<parameter=cmd>ls</parameter>\n", add_special_tokens=False))
    assert "tool_calls" not in parsed.message and "not closed" in parsed.tool_call_errors[0]
    # a good call next to a broken one: the good one is kept, the broken one reported
    text = "<function=a>\n<parameter=x>1</parameter>\n</function>\n<function=b>\n"
    parsed = r.parse_response(tok.encode(text, add_special_tokens=False))
    assert [c["function"]["name"] for c in parsed.message["tool_calls"]] == ["a"]
    assert len(parsed.tool_call_errors) == 1


def test_one_good_and_one_bad_hermes_call(tok):
    r = get_renderer(tok, DEFAULT_MODEL, tool_format="hermes")
    text = '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{bad}\n</tool_call>'
    parsed = r.parse_response(tok.encode(text, add_special_tokens=False))
    assert [c["function"]["name"] for c in parsed.message["tool_calls"]] == ["a"]
    assert len(parsed.tool_call_errors) == 1


def test_bad_tool_format_is_an_error(tok):
    with pytest.raises(ValueError, match="hermes"):
        get_renderer(tok, DEFAULT_MODEL, tool_format="json")

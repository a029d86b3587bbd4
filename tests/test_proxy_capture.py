"""Prompt splicing and call chaining: re-serialised history still maps to the sampled tokens."""

from __future__ import annotations

import json

import pytest

from tinkrl.proxy.capture import (
    AssistantTokens,
    CapturedCall,
    CapturedSample,
    CaptureStore,
    assistant_key,
    captured_to_trajectory,
    chain_calls,
)
from tinkrl.proxy.openai_api import ApiError, build_chat_prompt, parse_chat_request, sample_to_message
from tinkrl.rl.data import trajectory_to_sequences


def _call(prompt, sampled, cid="c"):
    return CapturedCall(
        cid, "chat", list(prompt), [CapturedSample(list(sampled), [-0.5] * len(sampled), "stop", "stop")], 0
    )


def test_assistant_key_survives_client_reserialisation():
    ours = {
        "role": "assistant",
        "content": "Let me look.\n",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "execute_bash", "arguments": '{"command": "ls", "timeout": 5}'},
            }
        ],
    }
    theirs = {
        "role": "assistant",
        "content": "<think>private</think>Let me look.",
        "refusal": None,
        "tool_calls": [
            {
                "id": "renumbered",
                "type": "function",
                "function": {"name": "execute_bash", "arguments": '{"timeout":5,"command":"ls"}'},
            }
        ],
    }
    other = json.loads(json.dumps(theirs))
    other["tool_calls"][0]["function"]["arguments"] = '{"command": "ls -a", "timeout": 5}'
    assert assistant_key(ours) == assistant_key(theirs)
    assert assistant_key(ours) != assistant_key(other)


def test_spliced_history_extends_the_sampled_prompt(renderer):
    tok = renderer.tokenizer
    tools = [{"type": "function", "function": {"name": "execute_bash", "parameters": {"type": "object"}}}]
    first = [{"role": "user", "content": "list files"}]
    store = CaptureStore()
    p1 = build_chat_prompt(renderer, first, tools, lambda m: store.lookup("r", m))
    # Tokens a tokenizer would not produce from the text: "ls" spelled as single letters.
    sampled = tok.encode('<tool_call>\n{"name": "execute_bash", "arguments": {"command": "', add_special_tokens=False)
    sampled += [tok.convert_tokens_to_ids("l"), tok.convert_tokens_to_ids("s")]
    sampled += tok.encode('"}}\n</tool_call>', add_special_tokens=False) + [renderer.im_end]
    choice = sample_to_message(renderer, "", sampled, "stop", [], parse_tools=True)
    assert choice.finish_reason == "tool_calls"
    assert json.loads(choice.message["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
    store.record("r", _call(p1.tokens, sampled), [(choice.message, AssistantTokens(sampled, True))])

    # The client sends it back re-serialised, with a tool result.
    back = json.loads(json.dumps(choice.message))
    back["tool_calls"][0]["function"]["arguments"] = '{"command":"ls"}'
    second = first + [back, {"role": "tool", "tool_call_id": back["tool_calls"][0]["id"], "content": "a.txt"}]
    p2 = build_chat_prompt(renderer, second, tools, lambda m: store.lookup("r", m))
    assert p2.spliced_messages == p2.assistant_messages == 1
    assert p2.tokens[: len(p1.tokens) + len(sampled)] == p1.tokens + sampled

    # Without the capture map the history is re-tokenised and the prefix breaks.
    plain = build_chat_prompt(renderer, second, tools, lambda m: None)
    assert plain.tokens[: len(p1.tokens) + len(sampled)] != p1.tokens + sampled
    assert plain.spliced_messages == 0


def test_cut_sample_gets_closed_by_the_renderer(renderer):
    store = CaptureStore()
    msgs = [{"role": "user", "content": "hi"}]
    p1 = build_chat_prompt(renderer, msgs, None, lambda m: None)
    sampled = renderer.tokenizer.encode("Hello there", add_special_tokens=False)  # cut by max_tokens
    choice = sample_to_message(renderer, "", sampled, "length", [], parse_tools=False)
    assert choice.finish_reason == "length"
    store.record("r", _call(p1.tokens, sampled), [(choice.message, AssistantTokens(sampled, False))])
    p2 = build_chat_prompt(
        renderer, msgs + [choice.message, {"role": "user", "content": "go on"}], None, lambda m: store.lookup("r", m)
    )
    n = len(p1.tokens) + len(sampled)
    assert p2.tokens[:n] == p1.tokens + sampled and p2.tokens[n] == renderer.im_end


def test_chains_pick_the_continued_sample_and_count_merges():
    a = CapturedCall(
        "a",
        "chat",
        [1, 2],
        [CapturedSample([3], [-1.0], "stop", "stop"), CapturedSample([4], [-2.0], "stop", "stop")],
        0,
    )
    b = _call([1, 2, 4, 9], [5], "b")  # continues a's second sample
    side = _call([7, 7], [8], "side")  # an unrelated conversation (e.g. a summariser)
    c = _call([1, 2, 4, 9, 5, 10], [6], "c")
    chains, stats = chain_calls([a, b, side, c])
    assert [[(x.call_id, s) for x, s in ch] for ch in chains] == [[("a", 1), ("b", 0), ("c", 0)], [("side", 0)]]
    assert (stats.calls, stats.merged_calls, stats.chains) == (4, 2, 2)
    assert stats.merge_rate == pytest.approx(2 / 3)

    traj, _ = captured_to_trajectory([a, b, side, c], reward=1.0)
    assert traj.transitions[-1].reward == 1.0 and traj.transitions[-1].episode_done
    assert traj.transitions[0].ac_tokens == [4] and traj.transitions[0].ac_logprobs == [-2.0]
    seqs = trajectory_to_sequences(traj, advantage=1.0)
    assert [s.tokens for s in seqs] == [[1, 2, 4, 9, 5, 10, 6], [7, 7, 8]]


def test_parameter_errors_name_the_field():
    with pytest.raises(ApiError) as e:
        parse_chat_request({"temperature": 3})
    assert e.value.status == 400 and e.value.param == "temperature"
    with pytest.raises(ApiError) as e:
        parse_chat_request({"top_logprobs": 3})
    assert e.value.param == "top_logprobs"
    with pytest.raises(ApiError) as e:
        parse_chat_request({"frequency_penalty": 0.5})
    assert "not supported" in e.value.message

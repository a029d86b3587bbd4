"""Shared by the proxy tests: a tiny policy taught (real LoRA SFT) to answer two prompts with tool calls.

The tiny random-weight model never emits a well-formed tool call by chance, and the tests
must not depend on luck, so the embedded engine fine-tunes it (~15 Adam steps) until greedy
decoding reproduces each target; prompts are rendered by the proxy's own prompt builder, so
they are exactly what the server will send to the sampler. Trained once per test process.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tinker import types

from tinkrl.agents.tools import TOOL_SCHEMAS
from tinkrl.local.models import TINY_MODEL
from tinkrl.proxy.openai_api import build_chat_prompt
from tinkrl.renderers import get_renderer

RUN_TOOL = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}
LIST_FILES = [{"role": "user", "content": "list the files"}]
LIST_FILES_CALL = '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls"}}\n</tool_call>'

AGENT_TOOLS = [t for t in TOOL_SCHEMAS if t["function"]["name"] in ("execute_bash", "submit")]
AGENT_SYSTEM = "You are a terminal agent. Use the tools to solve the task, then call submit."
HELLO_COMMAND = "echo 'Hello, world!' > /app/hello.txt"
HELLO_CALL = (
    "<tool_call>\n" + json.dumps({"name": "execute_bash", "arguments": {"command": HELLO_COMMAND}}) + "\n</tool_call>"
)

_cache: dict[str, tuple] = {}


def hello_instruction() -> str:
    """The instruction of the shipped hello-file task, exactly as the task loader gives it to agents."""
    from tinkrl.taskdirs import load_task

    return load_task(Path(__file__).resolve().parents[1] / "tasks" / "hello-file").instruction


def agent_messages(instruction: str) -> list[dict]:
    return [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": instruction}]


def tool_policy(service):
    """(training_client, sampling_client) whose greedy answers are LIST_FILES_CALL and HELLO_CALL."""
    if "policy" in _cache:
        return _cache["policy"]
    tc = service.create_lora_training_client(base_model=TINY_MODEL, rank=8, seed=0)
    tok = tc.get_tokenizer()
    renderer = get_renderer(tok, TINY_MODEL)
    examples = [
        (LIST_FILES, [RUN_TOOL], LIST_FILES_CALL),
        (agent_messages(hello_instruction()), AGENT_TOOLS, HELLO_CALL),
    ]
    data, checks = [], []
    for messages, tools, target_text in examples:
        prompt = build_chat_prompt(renderer, messages, tools, lambda m: None).tokens
        target = tok.encode(target_text, add_special_tokens=False) + [renderer.im_end]
        full = prompt + target
        weights = np.asarray([0.0] * (len(prompt) - 1) + [1.0] * len(target), dtype=np.float32)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={"target_tokens": np.asarray(full[1:], dtype=np.int64), "weights": weights},
            )
        )
        checks.append((prompt, target))
    sc = None
    for step in range(80):
        out = tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        if out.metrics["loss:sum"] > 1.0:
            continue
        sc = tc.save_weights_and_get_sampling_client(f"tool-policy-{step}")
        greedy = types.SamplingParams(max_tokens=64, temperature=0.0, stop=[renderer.im_end])
        outs = [sc.sample(types.ModelInput.from_ints(p), 1, greedy) for p, _ in checks]
        if all(list(o.result().sequences[0].tokens) == t for o, (_, t) in zip(outs, checks)):
            break
    else:
        raise AssertionError("the tiny policy did not learn its tool calls in 80 steps")
    _cache["policy"] = (tc, sc)
    return tc, sc

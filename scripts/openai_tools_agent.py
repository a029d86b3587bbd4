"""A plain OpenAI tool-calling agent, as anyone writes one, to plug into `env: external_agent` by command.

It knows only what tinkrl hands every agent process: OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL
(the run's server, a base URL per rollout), TINKRL_INSTRUCTION, and TINKRL_SANDBOX_URL where its
`bash` tool runs commands (the rollout's sandbox). Each turn it sends the whole conversation back,
runs the tool calls it gets, and stops when the model calls no tool or after TINKRL_STEP_LIMIT calls.

    environments:
      openai_agent:
        type: external_agent
        env: {agent: command, command: [python, scripts/openai_tools_agent.py]}
"""

from __future__ import annotations

import json
import os
import urllib.request

import openai

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the task's machine and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
SYSTEM = "You solve tasks on a Linux machine. Use the bash tool to run commands. Reply without a tool call when done."


def run_in_sandbox(command: str) -> str:
    """The command's exit code and output, run in the rollout's sandbox."""
    body = json.dumps({"command": command, "timeout": 30, "workdir": os.environ.get("TINKRL_WORKDIR") or None})
    request = urllib.request.Request(
        os.environ["TINKRL_SANDBOX_URL"] + "/exec",
        body.encode(),
        {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    result = json.loads(urllib.request.urlopen(request, timeout=120).read())
    return f"exit code {result['exit_code']}\n{result['output']}"


def main() -> None:
    """Run the agent loop once on TINKRL_INSTRUCTION."""
    client = openai.OpenAI(max_retries=0, timeout=600)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": os.environ["TINKRL_INSTRUCTION"]}]
    for _ in range(int(os.environ.get("TINKRL_STEP_LIMIT", "5"))):
        reply = client.chat.completions.create(
            model=os.environ["OPENAI_MODEL"],
            messages=messages,
            tools=[BASH_TOOL],
            temperature=float(os.environ.get("TINKRL_TEMPERATURE", "1.0")),
            max_tokens=int(os.environ.get("TINKRL_MAX_TOKENS", "256")),
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return
        for call in message.tool_calls:
            try:
                command = json.loads(call.function.arguments).get("command", "")
                output = run_in_sandbox(command) if call.function.name == "bash" else "unknown tool"
            except (json.JSONDecodeError, AttributeError):
                output = "the arguments are not a JSON object with a command"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output[-4000:]})


if __name__ == "__main__":
    main()

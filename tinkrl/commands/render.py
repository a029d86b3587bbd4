"""`tinkrl render MODEL [--renderer NAME] --messages FILE.json [--tools FILE.json]`: a conversation as
the prompt tokens a sampler gets for it.

Prints JSON `{"renderer", "renderer_reason", "tokens", "text"}`: the renderer the model gets (as
`tinkrl train` would choose it, or `--renderer`), the prompt's token ids with the assistant's
generation header at the end, and those tokens decoded. What a user checks when a reward
collapses: is this the format the model was trained to read? Works offline for every family
tml-renderers ships (its tokenizers are built in); the hand-written families read the model's
tokenizer from disk or the HF cache, and download it once when online.

`--messages` holds a JSON list of OpenAI-style messages (or an object with a `messages` list, and
optionally `tools`); `--tools` a JSON list of OpenAI tool schemas.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


class RenderInputError(ValueError):
    """A messages or tools file that cannot be read as such, in one line."""


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise RenderInputError(f"--{what} {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise RenderInputError(f"--{what} {path}: not JSON ({e.msg} at line {e.lineno})") from None


def read_conversation(messages_path: Path, tools_path: Path | None) -> tuple[list[dict], list[dict] | None]:
    """The messages and tools of the files named on the command line (RenderInputError when malformed)."""
    data = _read_json(messages_path, "messages")
    tools = data.get("tools") if isinstance(data, dict) else None
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise RenderInputError(f"--messages {messages_path}: expected a list of messages, each with a 'role'")
    if tools_path is not None:
        tools = _read_json(tools_path, "tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RenderInputError("--tools: expected a list of tool schemas")
    return messages, tools or None


def render(model: str, messages: list[dict], tools: list[dict] | None, name: str | None = None) -> dict:
    """The prompt a sampler gets for `messages` on `model`, as the JSON object the command prints."""
    from tinkrl.renderers import RENDERERS, choose_renderer, get_renderer, load_tokenizer, recommend

    chosen = choose_renderer(model, name)
    found = recommend(model)
    reason = "--renderer" if name else found.reason if found else "no rule names this model; its tokenizer is ChatML"
    needs_model_tokenizer = chosen is None or RENDERERS[chosen].tml is None
    tokenizer = load_tokenizer(model, chosen) if needs_model_tokenizer else None
    renderer = get_renderer(tokenizer, model, name=chosen)
    try:
        tokens = renderer.prompt_tokens(messages, tools)
    except (KeyError, TypeError, AttributeError) as e:  # a message or tool call missing a field, or of the wrong shape
        what = f"missing {e}" if isinstance(e, KeyError) else str(e)
        raise RenderInputError(
            f"--messages: the {renderer.name} renderer cannot render these messages ({what}); a tool call is "
            '{"id", "type": "function", "function": {"name", "arguments"}}'
        ) from None
    text = renderer.tokenizer.decode(tokens, skip_special_tokens=False)
    return {"renderer": renderer.name, "renderer_reason": reason, "tokens": tokens, "text": text}


def cli_main(argv: list[str]) -> int:
    """`tinkrl render`: exit 0 with the JSON on stdout, 2 on bad input (an unknown renderer or model, an
    unreadable file), 1 when the model's tokenizer cannot be had."""
    parser = argparse.ArgumentParser(prog="tinkrl render", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the model's name, as model_name= takes it (e.g. Qwen/Qwen3.5-4B)")
    parser.add_argument("--renderer", help="a renderer name (default: the model's, as tinkrl train chooses it)")
    parser.add_argument("--messages", required=True, type=Path, help="JSON file: the conversation")
    parser.add_argument("--tools", type=Path, help="JSON file: the tool schemas")
    args = parser.parse_args(argv)
    from tinkrl.errors import TinkrlError

    try:
        messages, tools = read_conversation(args.messages, args.tools)
        out = render(args.model, messages, tools, args.renderer)
    except ValueError as e:  # RenderInputError, an unknown renderer, a model no rule names
        print(f"tinkrl render: error: {e}", file=sys.stderr)
        return 2
    except (TinkrlError, OSError) as e:  # the model's tokenizer is neither on disk nor downloadable
        print(f"tinkrl render: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    print(json.dumps(out, ensure_ascii=False))
    return 0

"""Fuzzing what tinkrl parses that others wrote: task directories (`task.toml`, the Dockerfile read for
bubblewrap), every renderer's tool-call parser on what a model may emit, the Tinker wire format, the bwrap
framed protocol, and configs in the seed dialects.

What must hold for every generated input: the parser returns its result or raises its own documented
error (`TaskLoadError`, `WireError`, `ConfigError`, `EOFError`/`TimeoutError` for frames); never another
exception, and a renderer never raises at all (a malformed call becomes an error in the parsed reply, which
goes back to the model). Each target runs twice (tests/helpers/fuzz.py): a fast deterministic slice here,
and a long `slow` round.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

import pytest
from helpers.fuzz import fuzz_pair
from helpers.requirements import needs_bwrap
from hypothesis import strategies as st

from tinkrl.errors import ConfigError
from tinkrl.taskdirs.dockerfile import build_dockerfile
from tinkrl.taskdirs.loaders import load_task
from tinkrl.taskdirs.model import TaskLoadError

# -- text that looks like what each parser reads --------------------------------------------------------
WORDS = st.sampled_from(
    [
        "/app", "/tmp/x", "..", "../../etc/passwd", ".", "~", "$HOME", "${A}", "${B:-dflt}", "$", "${", "}",
        "'", '"', "\\", "=", "A=1", "B=\"two words\"", "--chown=1000:1000", "--from=build", "--chmod=755",
        "[", "]", '["bash", "-c", "ls"]', "[not json", "&&", ";", "|", "<<EOF", "EOF", "#", "\t", "ubuntu:22.04",
        "python:3.11-slim", "debian", "scratch", "alpine:3", "apt-get", "install", "-y", "pip", "curl",
        "http://x", "git", "clone", "echo", "hi", "\u00e9", "\u0000", "\ud800", " ",
    ]
)  # fmt: skip
TEXT = st.one_of(st.text(max_size=40), st.lists(WORDS, max_size=8).map(" ".join))
INSTRUCTIONS = st.sampled_from(
    ["FROM", "RUN", "COPY", "ADD", "WORKDIR", "ENV", "ARG", "USER", "CMD", "ENTRYPOINT", "EXPOSE", "LABEL",
     "SHELL", "VOLUME", "HEALTHCHECK", "ONBUILD", "STOPSIGNAL", "MAINTAINER", "from", "Run", "BOGUS", "#", ""]
)  # fmt: skip
DOCKERFILE = st.lists(st.tuples(INSTRUCTIONS, TEXT, st.sampled_from(["\n", " \\\n", "\r\n", "\n\n"])), max_size=10).map(
    lambda lines: "".join(f"{i} {rest}{end}" for i, rest, end in lines)
)


def _write(path: Path, text: str) -> None:
    """`text` as UTF-8, a lone surrogate written as the invalid bytes it stands for."""
    path.write_bytes(text.encode("utf-8", "surrogatepass"))


def _context(root: Path) -> Path:
    """A build context with a file and a directory in it, and a symlink out of it."""
    ctx = root / "environment"
    (ctx / "dir").mkdir(parents=True)
    (ctx / "file.txt").write_text("x")
    (ctx / "dir" / "inner.txt").write_text("y")
    (ctx / "out").symlink_to("/etc")
    return ctx


def check_dockerfile(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ctx = _context(Path(tmp))
        _write(ctx / "Dockerfile", text)
        try:
            build = build_dockerfile(ctx / "Dockerfile", ctx)
        except TaskLoadError:
            return
        assert all(step.origin.startswith("Dockerfile:") for step in build.steps)
        assert build.workdir.startswith("/")


test_dockerfile_fast, test_dockerfile_long = fuzz_pair(check_dockerfile, DOCKERFILE, fast=60)

# -- task.toml ---------------------------------------------------------------------------------------------
SCALARS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True),
    st.booleans(),
    TEXT,
    st.lists(st.integers(), max_size=3),
)
TOML_KEYS = {
    "task": ["name"],
    "metadata": ["tinkrl_grader", "difficulty", "category", "tags"],
    "agent": ["timeout_sec"],
    "verifier": ["timeout_sec", "env"],
    "environment": ["workdir", "docker_image", "memory_mb", "storage_mb", "cpus", "env"],
    "solution": ["env"],
}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


@st.composite
def task_toml(draw) -> str:
    """A task.toml: known sections with known and unknown keys of any type, a value where a table belongs, or
    text that is not TOML at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(TEXT)
    lines = []
    for section, keys in TOML_KEYS.items():
        if draw(st.booleans()):
            continue
        if draw(st.integers(0, 9)) == 0:
            lines.insert(0, f"{section} = {_toml_value(draw(SCALARS))}")
            continue
        lines.append(f"[{section}]")
        for key in draw(st.lists(st.sampled_from([*keys, "unknown"]), max_size=4, unique=True)):
            value = draw(st.one_of(SCALARS, st.dictionaries(st.text(max_size=5), SCALARS, max_size=2)))
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def check_task_dir(toml: str, instruction: str, dockerfile: str | None, test_sh: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "task"
        d.mkdir()
        _write(d / "task.toml", toml)
        _write(d / "instruction.md", instruction)
        if test_sh:
            (d / "tests").mkdir()
            (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
        if dockerfile is not None:
            _write(_context(d) / "Dockerfile", dockerfile)
        try:
            task = load_task(d)
        except TaskLoadError:
            return
        assert task.instruction and task.workdir.startswith("/")
        assert task.agent_timeout_s > 0 and task.verifier_timeout_s > 0 and task.memory_mb > 0


test_task_dir_fast, test_task_dir_long = fuzz_pair(
    check_task_dir, task_toml(), TEXT, st.none() | DOCKERFILE, st.booleans(), fast=60
)


# -- what a model emits, through each renderer's parser ------------------------------------------------------
def _renderers():
    from test_renderers_families import renderer, skip_reason

    from tinkrl.renderers.names import RENDERERS

    built = []
    for name in RENDERERS:
        if skip_reason(name):
            continue
        built.append(renderer(name))
        if RENDERERS[name].hand is not None:
            built.append(renderer(name, "xml"))
    return built


@pytest.fixture(scope="module")
def renderers():
    return _renderers()


MARKUP = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<think>", "</think>", "<function=", "<function=ls>", "</function>",
     "<parameter=path>", "<parameter=", "</parameter>", '{"name": "ls", "arguments": {"path": "/"}}',
     '{"name": "ls", "arguments": "{\\"path\\": 1}"}', '{"name": 5}', '{"name": "ls", "arguments": [1]}', "{", "}",
     "null", "<|im_end|>", "<|im_start|>", "<|eot_id|>", "<|python_tag|>", "<|tool_calls_section_begin|>",
     "<|tool_call_begin|>", "functions.ls:0", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
     "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
     "<|start|>", "<|channel|>", "commentary to=functions.ls", "<|message|>", "<|call|>", "<|end|>",
     "<tool_response>", "\n", "```", "```json"]
)  # fmt: skip
REPLY = st.lists(st.one_of(MARKUP, st.text(max_size=12)), max_size=12).map("".join)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}},
        },
    }
]


def check_reply(renderers, text: str, token_noise: list[int], declare_tools: bool) -> None:
    tools = TOOLS if declare_tools else None
    for r in renderers:
        parsed = r.parse_text(text, tools)
        assert parsed.message["role"] == "assistant" and isinstance(parsed.tool_call_errors, list)
        tokens = list(r.tokenizer.encode(text, add_special_tokens=False))
        vocab = len(r.tokenizer)
        tokens += [t % vocab for t in token_noise]
        parsed = r.parse_response(tokens, tools)
        assert parsed.message["role"] == "assistant"
        for call in parsed.message.get("tool_calls") or []:
            assert call["function"]["name"], call


test_renderer_replies_fast, test_renderer_replies_long = fuzz_pair(
    check_reply, REPLY, st.lists(st.integers(0, 2**20), max_size=4), st.booleans(), fast=30, long=1500
)


# -- the Tinker wire format --------------------------------------------------------------------------------
def _valid_forward_backward() -> bytes:
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn="cross_entropy")
    datum = msg.data.add()
    chunk = datum.model_input.add()
    chunk.encoded_text.tokens = b"\x01\x00\x00\x00\x02\x00\x00\x00"
    return msg.SerializeToString()


@st.composite
def wire_bodies(draw) -> tuple[bytes, str | None]:
    """A forward_backward body: random bytes, or a valid one with bytes flipped, cut or appended; maybe zstd."""
    import zstandard

    body = draw(st.binary(max_size=200)) if draw(st.booleans()) else _valid_forward_backward()
    for _ in range(draw(st.integers(0, 4))):
        if not body:
            break
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1 :]
    body = body[: draw(st.integers(0, len(body)))] + draw(st.binary(max_size=8))
    encoding = draw(st.sampled_from([None, "identity", "zstd", "zstd-bad", "gzip"]))
    if encoding == "zstd":
        body = zstandard.ZstdCompressor().compress(body)
    elif encoding == "zstd-bad":
        encoding = "zstd"
    return body, encoding


def check_wire(body_and_encoding: tuple[bytes, str | None]) -> None:
    from tinkrl.tinker_server.wire import WireError, decode_forward_backward

    try:
        call = decode_forward_backward(body_and_encoding[0])  # the server decodes Content-Encoding first
    except WireError:
        return
    assert call.model_id and all(d.model_input is not None for d in call.data)


test_wire_fast, test_wire_long = fuzz_pair(check_wire, wire_bodies(), fast=80, long=5000)


# -- the bwrap framed protocol (host side) -------------------------------------------------------------------
@st.composite
def frame_streams(draw) -> bytes:
    """What a sandbox's pid 1 might write: whole frames, then garbage or a frame cut short."""
    from tinkrl.sandbox.bwrap.protocol import encode_frame

    fields = st.lists(st.one_of(st.binary(max_size=20), st.text(max_size=10), st.integers()), max_size=6)
    out = b"".join(encode_frame(f) for f in draw(st.lists(fields, max_size=3)))
    tail = draw(st.one_of(st.binary(max_size=16), st.just(b"\x00\x00\x00\x02\x00\x00\x00\x05ab")))
    return out + tail


def check_frames(stream: bytes) -> None:
    from tinkrl.sandbox.bwrap.protocol import FrameReader

    r, w = os.pipe()
    try:
        os.write(w, stream)
        os.close(w)
        w = -1
        reader = FrameReader(r)
        frames = 0
        while True:
            try:
                fields = reader.recv(time.monotonic() + 2)
            except EOFError:
                break
            frames += 1
            assert all(isinstance(f, bytes) for f in fields)
            assert frames <= len(stream)  # every frame takes at least its 4-byte count
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


test_bwrap_frames_fast, test_bwrap_frames_long = fuzz_pair(check_frames, frame_streams(), fast=60, long=5000)

# -- configs in the seed dialects ------------------------------------------------------------------------
CONFIG_KEYS = st.sampled_from(
    ["model_name", "env", "batch_size", "group_size", "learning_rate", "max_tokens", "max_steps", "lora_rank",
     "loss_fn", "adv_estimator", "temperature", "dialect", "optim.lr", "optim.beta1", "num_batches",
     "minitb.dataset", "minitb.task_id", "minitb.dataset_path", "wandb.enabled", "wandb.project", "log_path",
     "wandb_project_name", "wandb_run_name", "openreward_run_name", "advantage_calculation", "max_response_tokens",
     "thinking", "environments", "environments.math.num_rollouts", "num_epochs", "env.format_coef", "envs",
     "kl_penalty_coef", "save_every", "eval_every", "renderer_name", "backend", "base_url", "sandbox.provider",
     "seed", "unknown_key", "", ".", "a..b"]
)  # fmt: skip
CONFIG_VALUES = st.one_of(
    st.sampled_from(
        ["MathConfig", "ErdosConfig", "arithmetic", "math", "tasks", "1", "0", "-1", "1e-4", "nan", "inf", "true",
         "False", "null", "[1, 2]", "{a: 1}", "{", "gsm8k==1.0", "ppo", "importance_sampling", "tinker", "local",
         "grpo", "'quoted", "x" * 300]
    ),
    st.text(max_size=12),
)  # fmt: skip


def check_config(pairs: list[tuple[str, str]]) -> None:
    from tinkrl.config import load_config

    try:
        config = load_config(None, [f"{k}={v}" for k, v in pairs])
    except ConfigError as e:
        assert str(e).strip()
        return
    assert config.dialect in ("tinkrl", "tinking", "openreward")


test_seed_configs_fast, test_seed_configs_long = fuzz_pair(
    check_config, st.lists(st.tuples(CONFIG_KEYS, CONFIG_VALUES), max_size=6), fast=80, long=4000
)


# -- the bwrap framed protocol (pid 1's side, the compiled bwrap_init.c by default) ---------------------------
@pytest.fixture(scope="module")
def sandbox(bwrap_provider):
    from tinkrl.sandbox.base import SandboxSpec

    with bwrap_provider.create(SandboxSpec(workdir="/app", memory_mb=256, pids=64, disk_mb=32)) as sb:
        yield sb


FIELD = st.one_of(st.binary(max_size=24), st.sampled_from([b"", b"/", b"/app/x", b"/proc/1/fd/1", b"/tmp", b"..",
                                                           b"-1", b"99999999999999999999", b"persist", b"fresh"]))  # fmt: skip
REQUESTS = st.one_of(
    st.tuples(st.sampled_from(["write", "read", "tar", "untar", "killall", "ping", "bogus", ""]), st.lists(FIELD, max_size=8)),
    # an exec whose command, directory, environment and mode are anything, but which ends within 3 s
    st.tuples(st.just("exec"), st.tuples(FIELD, st.just(b"3000"), FIELD, FIELD, FIELD, st.just(b"4096")).map(list)),
)  # fmt: skip


def check_pid1_requests(sandbox, request: tuple[str, list[bytes]]) -> None:
    op, fields = request
    try:
        reply = sandbox._call([op, *fields], 15.0)
    except OSError:
        pass  # an "err" reply: the request was refused, the sandbox answered
    else:
        assert all(isinstance(f, bytes) for f in reply)
    assert sandbox.alive, "pid 1 died on a request"
    assert sandbox.exec("echo alive", timeout=10).stdout == "alive\n"


test_bwrap_pid1_fast, test_bwrap_pid1_long = map(
    needs_bwrap, fuzz_pair(check_pid1_requests, REQUESTS, fast=40, long=2000)
)

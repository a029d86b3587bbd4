"""The `shell` task family: templates, held-out sets, checker integrity, sandbox limits, and the whole
agent pipeline (warm start, RL, episode transcripts, the checkpoint's action format) on the tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.envs.shell.config import HELD_OUT_TEMPLATE_NAMES, TRAIN_TEMPLATE_NAMES, ShellEnvConfig
from tinkrl.envs.shell.tasks import LIMITS, held_out, instance, template_of, to_task, train_instance
from tinkrl.envs.shell.templates import DIRS, HELD_OUT_TEMPLATES, TEMPLATES, TRAIN_TEMPLATES, WORDS
from tinkrl.errors import ConfigError
from tinkrl.sandbox import LazyProvider
from tinkrl.taskdirs import grade, run_gate, start_sandbox

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tasks"


def test_the_config_names_the_templates_the_family_has() -> None:
    assert list(TRAIN_TEMPLATES) == TRAIN_TEMPLATE_NAMES and list(HELD_OUT_TEMPLATES) == HELD_OUT_TEMPLATE_NAMES
    assert not set(TRAIN_TEMPLATES) & set(HELD_OUT_TEMPLATES)
    with pytest.raises(ValueError, match="unknown template"):
        ShellEnvConfig(templates=["make_dir", "no_such"])
    with pytest.raises(ValueError, match="both trained on and held out"):
        ShellEnvConfig(templates=["copy_dir"])


def test_no_word_is_part_of_another() -> None:  # grep-based templates count lines containing a word
    assert not [(a, b) for a in WORDS for b in WORDS if a != b and a in b]


def test_instances_are_seeded_and_varied() -> None:
    for name in TEMPLATES:
        assert instance(name, 7) == instance(name, 7)
        assert len({instance(name, s).key for s in range(20)}) >= 10, name


def _names(text: str) -> set[str]:
    """The names an instruction mentions: files, directories (a path's parts), words of contents, numbers."""
    tokens = {part for t in text.split() for part in t.strip(".,;:()?`").split("/")}
    return {t for t in tokens if "." in t or t in DIRS or t in WORDS or t.isdigit()} - {""}


def test_every_wording_of_an_instance_names_the_same_things() -> None:
    """A paraphrase is the same task: it names every file, directory, word and number its first wording
    names, and nothing else, with paths relative or absolute; all wordings and both path styles are
    used, and neither ever changes the instance's key."""
    for name in TRAIN_TEMPLATES:
        wordings, styles = set(), set()
        for seed in range(60):
            plain, told = instance(name, seed), instance(name, seed, paraphrase=True)
            assert told.key == plain.key and told.instruction == plain.instruction and plain.wording == 0
            assert not plain.absolute and plain.told == plain.wordings[0]
            assert to_task(told).instruction == told.told and to_task(plain).instruction == plain.told
            assert len(told.wordings) >= 4, name  # the first wording and at least three others
            for words in told.wordings:
                assert _names(words) == _names(plain.told), (name, words, plain.told)
                assert ("/app/" in words) == told.absolute and "\x1e" not in words, (name, words)
            wordings.add(told.wording)
            styles.add(told.absolute)
        assert wordings == set(range(len(told.wordings))) and styles == {False, True}, name
    for name in HELD_OUT_TEMPLATES:  # told as they always were: the generalisation test does not move
        assert all(instance(name, s, paraphrase=True) == instance(name, s) for s in range(5))


def test_held_out_instances_never_appear_in_the_train_stream() -> None:
    tests = held_out(TRAIN_TEMPLATE_NAMES, 3, seed=0)
    assert len(tests) == 3 * len(TRAIN_TEMPLATE_NAMES)
    keys = {t.key for t in tests}
    stream = [train_instance(TRAIN_TEMPLATE_NAMES, p, 0, keys) for p in range(3000)]
    assert not keys & {i.key for i in stream}
    assert {i.template for i in stream} == set(TRAIN_TEMPLATE_NAMES)  # every trained template, no held-out one
    # in any wording: the key is the task's, not its words'
    worded = held_out(TRAIN_TEMPLATE_NAMES, 3, seed=0, paraphrase=True)
    assert {t.key for t in worded} == keys and {t.wording for t in worded} >= {0, 1, 2, 3}
    assert {t.absolute for t in worded} == {False, True}
    stream = [train_instance(TRAIN_TEMPLATE_NAMES, p, 0, keys, paraphrase=True) for p in range(1000)]
    assert not keys & {i.key for i in stream}
    # an excluded instance is redrawn: the exclusion, not luck, keeps the sets apart
    drawn = train_instance(TRAIN_TEMPLATE_NAMES, 11, 0, set())
    redrawn = train_instance(TRAIN_TEMPLATE_NAMES, 11, 0, {drawn.key})
    assert redrawn.key != drawn.key and redrawn.template == drawn.template


def _group(template_seed: tuple[str, int], rewards: list[float]):
    """A finished group of the shell family's instance of (template, seed) with these rewards."""
    import tinker

    from tinkrl.rl.types import Trajectory, TrajectoryGroup, Transition

    task = to_task(instance(*template_seed))
    trajs = [
        Trajectory(
            [
                Transition(
                    tinker.ModelInput.empty(), [1], [0.0], r, True, logs={"tasks/task": task.id, "tasks/transcript": []}
                )
            ]
        )
        for r in rewards
    ]
    return TrajectoryGroup(trajs, [0.0] * len(rewards), [{}] * len(rewards), ["shell"])


def test_a_run_draws_templates_whose_groups_no_longer_split_less_often(renderer, tmp_path) -> None:
    """With downweight_constant, a template whose recent groups all scored alike (every attempt solved,
    or none) is drawn less often, in proportion to that share; the tally a run records is the one its
    episode log gives back, so a resumed stream draws the same batches; without it the draw is uniform."""
    from tinkrl.config import EnvEntry
    from tinkrl.envs import EnvContext
    from tinkrl.envs.shell.env import build_datasets
    from tinkrl.envs.shell.focus import GroupTally
    from tinkrl.rl.metrics import episode_rows

    templates = ["make_dir", "head_lines", "sort_lines", "copy_file"]
    assert template_of(to_task(instance("head_lines", 3, paraphrase=True)).id) == "head_lines"
    assert template_of("hello-file") is None and template_of("shell-no_such-abc") is None
    ctx = EnvContext("shell", EnvEntry(), renderer, "tinkrl/tiny-llama", 2, 8, 32, tmp_path / "run", seed=0)
    cfg = ShellEnvConfig(templates=templates, test_per_template=1, downweight_constant=0.75)
    data = build_datasets(cfg, ctx)
    solved = [_group(("make_dir", s), [1.0, 1.0]) for s in range(4)]
    failed = [_group(("sort_lines", s), [0.0, 0.0]) for s in range(2)] + [_group(("sort_lines", 2), [1.0, 0.0])]
    mixed = [_group(("head_lines", s), [1.0, 0.0]) for s in range(3)]
    metrics = data.on_step(0, solved + failed + mixed)
    assert metrics == {"env/shell/constant_templates": 1}
    assert data.train.tally.weights(templates, 1, 0.75) == [0.25, 1.0, 0.5, 1.0]
    assert data.train.tally.weights(templates, 0, 0.75) == [1.0] * 4  # batch 0 sees no step before it
    drawn = [b.task.metadata["template"] for i in range(1, 200) for b in data.train.get_batch(i)]
    share = drawn.count("make_dir") / len(drawn)
    assert 0.06 < share < 0.10, share  # 0.25 / 2.75 of the draws, against a quarter without the tally
    # the episode log of that step gives the same tally back: a resumed run draws the same batches
    rows = episode_rows([("shell", g) for g in solved + failed + mixed], 0, None, set())
    (ctx.run_dir / "episodes").mkdir(parents=True)
    (ctx.run_dir / "episodes" / "step_000000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reread = GroupTally()
    reread.load(ctx.run_dir / "episodes")
    assert reread.by_step == data.train.tally.by_step
    resumed = build_datasets(cfg, ctx).train
    assert [b.task.id for b in resumed.get_batch(5)] == [b.task.id for b in data.train.get_batch(5)]
    plain = build_datasets(cfg.model_copy(update={"downweight_constant": 0.0}), ctx)
    assert plain.on_step is None
    uniform = [b.task.metadata["template"] for i in range(1, 200) for b in plain.train.get_batch(i)]
    assert 0.2 < uniform.count("make_dir") / len(uniform) < 0.3


def test_the_held_out_templates_may_have_an_eval_size_of_their_own(renderer, tmp_path) -> None:
    from tinkrl.config import EnvEntry
    from tinkrl.envs import EnvContext
    from tinkrl.envs.shell.env import build_datasets

    ctx = EnvContext("shell", EnvEntry(), renderer, "tinkrl/tiny-llama", 2, 2, 32, tmp_path, seed=0)
    cfg = ShellEnvConfig(templates=["make_dir", "head_lines"], test_per_template=2, test_per_held_out_template=5)
    tags = [b.logging_tags()[0] for b in build_datasets(cfg, ctx).test.get_batch(0)]
    assert tags.count("heldout_instances") == 2 * 2 and tags.count("heldout_templates") == 5 * len(HELD_OUT_TEMPLATES)
    same = ShellEnvConfig(templates=["make_dir"], test_per_template=3)  # unset: test_per_template for both
    tags = [b.logging_tags()[0] for b in build_datasets(same, ctx).test.get_batch(0)]
    assert tags.count("heldout_instances") == 3 and tags.count("heldout_templates") == 3 * len(HELD_OUT_TEMPLATES)
    written = ShellEnvConfig(templates=["make_dir"], test_per_template=1, eval_tasks=[str(TASKS / "append-host")])
    (task,) = [b.task for b in build_datasets(written, ctx).test.get_batch(0) if b.logging_tags() == ["handwritten"]]
    assert task.id == "append-host" and "/app/hosts.txt" in task.instruction
    missing = ShellEnvConfig(eval_tasks=[str(tmp_path / "no-such-task")])
    with pytest.raises(ConfigError, match="env.eval_tasks: .*no-such-task"):
        build_datasets(missing, ctx)


@needs_bwrap
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_every_template_passes_the_gate(name, bwrap_provider) -> None:
    """The reference solution scores 1 and doing nothing scores 0, for several instances of each template,
    told with relative paths and with absolute ones."""
    for seed in range(3):
        told = instance(name, [seed, 99], paraphrase=True)
        for inst in (dataclasses.replace(told, absolute=False), dataclasses.replace(told, absolute=True)):
            task = to_task(inst)
            result = run_gate(task, bwrap_provider, use_cache=False)
            assert result.ok, (task.instruction, result.detail)


@needs_bwrap
def test_reference_commands_with_absolute_paths_work_from_any_directory(bwrap_provider) -> None:
    """Told with absolute paths, every trained template's reference commands solve the task run from /
    (not the working directory), as they are written for a reader who knows no working directory."""
    for name in TRAIN_TEMPLATES:
        inst = dataclasses.replace(instance(name, [5, 99], paraphrase=True), absolute=True)
        task = to_task(inst)
        sandbox = start_sandbox(task, bwrap_provider)
        try:
            for command in inst.commands:
                result = sandbox.exec(command, timeout=30, workdir="/")
                assert result.exit_code == 0, (name, command, result.output)
            assert grade(task, sandbox).reward == 1.0, (name, inst.commands)
        finally:
            sandbox.close()


@needs_bwrap
@pytest.mark.parametrize("name", [n for n in TEMPLATES if instance(n, 0).mistake])
def test_a_mistake_fails_with_an_error_and_changes_nothing(name, bwrap_provider) -> None:
    """A template's typical mistake exits non-zero with an error message and leaves the tree as it was,
    so a recovery demonstration shows a real error before its fix."""
    for seed, absolute in ((0, False), (1, True), (2, False)):
        inst = dataclasses.replace(instance(name, [seed, 99]), absolute=absolute)
        task = to_task(inst)
        sandbox = start_sandbox(task, bwrap_provider)
        try:
            before = sandbox.exec("find . | sort | xargs -d '\\n' ls -ld --time-style=+", timeout=30).output
            result = sandbox.exec(inst.wrong_command, timeout=30)
            named = any(
                e in result.output for e in ("No such file or directory", "Not a directory", "Permission denied")
            )
            assert result.exit_code != 0 and named, (inst.wrong_command, result)
            assert sandbox.exec("find . | sort | xargs -d '\\n' ls -ld --time-style=+", timeout=30).output == before
        finally:
            sandbox.close()


@needs_bwrap
def test_a_recovery_demonstration_shows_the_error_then_the_fix(bwrap_provider) -> None:
    from tinkrl.envs.shell.env import reference_transcript

    inst = instance("write_into_new_dir", 4)
    messages = asyncio.run(
        reference_transcript(inst, ShellEnvConfig(), LazyProvider(lambda: bwrap_provider), recover=True)
    )
    assert messages is not None  # scored 1 after the fix
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert inst.wrong_command in messages[2]["content"] and "No such file or directory" in messages[3]["content"]
    assert inst.commands[0] in messages[4]["content"] and messages[6]["content"] == "DONE"


@needs_bwrap
def test_a_wrong_end_state_scores_0(bwrap_provider) -> None:
    """Near misses fail: the right file plus a stray one, a deleted neighbour, the count with the file name."""
    cases = [
        ("copy_file", lambda i: f"{i.commands[0]} && touch stray.txt"),
        ("delete_file", lambda i: "rm -f *"),
        ("count_lines", lambda i: i.commands[0].replace("< ", "")),  # `wc -l f.txt` writes "5 f.txt"
    ]
    for name, wrong in cases:
        inst = instance(name, 3)
        sandbox = start_sandbox(to_task(inst), bwrap_provider)
        try:
            assert sandbox.exec(wrong(inst), timeout=30).exit_code == 0
            assert grade(to_task(inst), sandbox).reward == 0.0, name
        finally:
            sandbox.close()


@needs_bwrap
def test_the_checker_cannot_be_satisfied_by_writing_its_own_files(bwrap_provider) -> None:
    """An agent that writes reward 1, a checker that always passes and an expected tree matching an empty
    directory scores 0: /tests and /logs/verifier are emptied and refilled after its processes are killed."""
    inst = instance("write_line", 5)
    task = to_task(inst)
    sandbox = start_sandbox(task, bwrap_provider)
    try:
        forge = (
            "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
            'printf \'open("/logs/verifier/reward.txt","w").write("1")\' > /tests/check_tree.py && '
            'echo \'{"root": "/app", "tree": {}}\' > /tests/expected.json && '
            "(while true; do echo 1 > /logs/verifier/reward.txt; sleep 0.01; done) >/dev/null 2>&1 &"
        )
        assert sandbox.exec(forge, timeout=30).exit_code == 0
        result = grade(task, sandbox)
        assert result.reward == 0.0 and "missing file" in result.output
    finally:
        sandbox.close()


@needs_bwrap
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_sandbox_limits_hold_for_every_template(name, bwrap_provider) -> None:
    """Every generated task runs with the family's caps: no network, a small disk, few processes."""
    task = to_task(instance(name, 1))
    assert {k: getattr(task, k) for k in LIMITS} == LIMITS
    sandbox = start_sandbox(task, bwrap_provider)
    try:
        net = sandbox.exec(
            "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"", timeout=30
        )
        assert net.exit_code != 0 and "unreachable" in net.output.lower()
        disk = sandbox.exec("head -c 32M /dev/zero > /app/big", timeout=30)
        assert disk.exit_code != 0 and "No space left" in disk.output
        forks = sandbox.exec("for i in $(seq 100); do sleep 5 & done; wait", timeout=30)
        assert forks.exit_code != 0 and "fork" in forks.output.lower()
    finally:
        sandbox.close()


@needs_bwrap
def test_reference_transcripts_are_real_episodes(bwrap_provider, renderer) -> None:
    """A demonstration is the episode the reference solution produces (real output, graded 1), and as
    supervised tokens it is exactly what SessionEnv builds when those replies are sampled."""
    from tinkrl.agents.episode import SessionEnv
    from tinkrl.envs.shell.env import reference_transcript
    from tinkrl.rl.supervised import conversation_datums

    cfg = ShellEnvConfig()
    inst = instance("count_matches", 2)
    messages = asyncio.run(reference_transcript(inst, cfg, LazyProvider(lambda: bwrap_provider)))
    assert messages is not None
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[3]["content"] == "[exit code: 0]" and messages[4]["content"] == "DONE"
    [(tokens, weights)] = conversation_datums(renderer, messages)  # ChatML keeps its past turns: one datum

    async def replay() -> list[int]:
        from tinkrl.agents.session import TaskSession

        env = SessionEnv(TaskSession(to_task(inst), cfg, LazyProvider(lambda: bwrap_provider)), renderer)
        ob, _ = await env.initial_observation()
        seq = ob.to_ints()
        try:
            for reply in (messages[2], messages[4]):
                action = renderer.action_tokens(reply)
                result = await env.step(action)
                seq = seq + action if result.episode_done else result.next_observation.to_ints()
            assert result.reward == 1.0
        finally:
            await env.close()
        return seq

    assert tokens == asyncio.run(replay())
    trained = [t for t, w in zip(tokens, weights) if w]
    assert trained == renderer.action_tokens(messages[2]) + renderer.action_tokens(messages[4])


def test_checkpoints_carry_the_turn_cap_the_run_trained_with() -> None:
    """`tinkrl eval --checkpoint` plays as many turns as training did unless told otherwise: the run's
    checkpoints record its environments' max_turns beside the action format."""
    from tinkrl.config import load_config
    from tinkrl.envs import checkpoint_metadata

    meta = checkpoint_metadata(load_config(None, ["env=shell", "env.max_turns=4"]))
    assert meta == {"action_format": "shell", "tool_format": "hermes", "max_turns": "4"}
    two = load_config(
        None, ["environments.a.type=shell", "environments.b.type=shell", "environments.b.env.max_turns=5"]
    )
    assert "max_turns" not in checkpoint_metadata(two)  # environments that disagree name none


def test_a_run_without_demonstrations_says_how_to_warm_start() -> None:
    from tinkrl.rl.types import EnvDatasets
    from tinkrl.rl.warm_start import gather_demonstrations

    with pytest.raises(ConfigError, match="warm_start.data"):
        asyncio.run(gather_demonstrations({"math": EnvDatasets(train=None)}, 4))  # type: ignore[arg-type]


@needs_bwrap
def test_the_agent_pipeline_runs_on_the_tiny_model(tmp_path, monkeypatch, isolated_home, capsys) -> None:
    """`tinkrl train env=shell` with a warm start: base eval, supervised steps, its weights saved as the KL
    penalty's reference, 2 RL steps, full held-out evals (hand-written tasks among them) before RL and after
    it with a fixed sample between, the summary of each phase's gain and of the time, per-episode
    transcripts, and a checkpoint that `tinkrl eval` runs in the shell format."""
    from tinkrl.cli import main as tinkrl

    monkeypatch.chdir(tmp_path)
    run = [
        "train",
        "env=shell",
        "model_name=tinkrl/tiny-llama",
        "backend=local",
        "groups_per_step=2",
        "group_size=2",
        "max_steps=2",
        "max_tokens=12",
        "eval_every=1",
        "save_every=0",
        "env.test_per_template=1",
        "env.held_out_templates=[count_words,copy_dir]",
        f"env.eval_tasks=[{TASKS / 'hello-file'},{TASKS / 'append-host'}]",
        "eval_sample_size=3",
        "warm_start.steps=2",
        "warm_start.batch_size=4",
        "warm_start.demonstrations=6",
        "kl_penalty_coef=0.1",
        "kl_reference=warm_start",
        "run_name=agent",
    ]
    assert tinkrl(run) == 0
    out = capsys.readouterr().out
    final = [line for line in out.splitlines() if line.startswith("final sampler weights: ")]
    assert len(final) == 1
    run_dir = tmp_path / "runs" / "agent"
    phases = [json.loads(line) for line in (run_dir / "warm_start.jsonl").read_text().splitlines()]
    assert phases[0]["phase"] == "base" and "eval/shell/heldout_templates/sampled_reward" in phases[0]
    sft = [p for p in phases if p["phase"] == "sft"]
    assert [p["sft_step"] for p in sft] == [0, 1] and all(p["sft/tokens"] > 0 for p in sft)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    # the KL's reference is the warm start's weights: step 0 samples with them, so its KL is ~0
    (ws_row,) = [json.loads(r) for r in (run_dir / "checkpoints.jsonl").read_text().splitlines() if "warm_start" in r]
    assert ws_row["state_path"] is None and ws_row["sampler_path"].endswith("warm_start") and ws_row["batch"] == 0
    assert abs(metrics[0]["kl_policy_warm_start"]) < 1e-2
    for tag in ("heldout_instances", "heldout_templates", "handwritten"):
        assert 0.0 <= metrics[-1][f"eval/shell/{tag}/greedy_reward"] <= 1.0  # the final eval
        assert f"eval/shell/{tag}/sampled_reward_stderr" in metrics[0]  # the full eval before RL
    assert "eval_sample/shell/greedy_reward_stderr" in metrics[1] and "time/final_eval" in metrics[1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["evals"]) == {"base", "warm_start", "rl"} and summary["rl_steps"] == 2
    assert "shell/handwritten/greedy_reward" in summary["gain"]["rl"]
    assert summary["base_eval"] == {"cached": False, "kind": "full"}
    # each eval's episodes are kept; the summary counts the problems solved before and after RL
    evals = {p.name: [json.loads(r) for r in p.read_text().splitlines()] for p in (run_dir / "evals").iterdir()}
    assert sorted(evals) == ["step_000000.jsonl", "step_000001.jsonl", "step_000002.jsonl"]
    assert len(evals["step_000001.jsonl"]) == 3  # the in-run sample
    last = [r for r in evals["step_000002.jsonl"] if r["tag"] == "handwritten" and r["mode"] == "greedy"]
    assert sorted(r["tasks/task"] for r in last) == ["append-host", "hello-file"]
    written = summary["problems"]["handwritten"]
    assert written["of"] == 2 and written["after"] == sum(r["reward"] == 1 for r in last)
    t = summary["time"]
    assert 0 < t["eval_s"] < t["total_s"] and t["eval_share"] == pytest.approx(t["eval_s"] / t["total_s"], abs=0.01)
    assert {"eval/base_s", "warm_start_s", "eval/before_rl_s", "eval/sample_s", "eval/final_s", "rl_s"} <= set(t)
    plot = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "plot_agent.py"), str(run_dir), "--out", str(tmp_path / "curve.png")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert plot.returncode == 0 and (tmp_path / "curve.png").stat().st_size > 10_000, plot.stderr
    episodes = [json.loads(line) for line in (run_dir / "episodes" / "step_000000.jsonl").read_text().splitlines()]
    assert len(episodes) == 4
    for e in episodes:
        assert e["tasks/task"].startswith("shell-") and e["reward"] in (0.0, 1.0)
        roles = [m["role"] for m in e["tasks/transcript"]]
        assert roles[:3] == ["system", "user", "assistant"] and "```bash" in e["tasks/transcript"][0]["content"]

    checkpoint = final[0].split(": ", 1)[1]
    rc = tinkrl(
        ["eval", "--tasks", str(TASKS), "--task-id", "hello-file", "--checkpoint", checkpoint]
        + ["--max-tokens", "8", "--output-path", str(tmp_path / "eval"), "--run-id", "e"]
    )
    assert rc == 0, capsys.readouterr().err
    results = json.loads((tmp_path / "eval" / "e" / "results.json").read_text())
    assert results["action_format"] == "shell" and results["max_turns"] == 3  # the turns it trained with
    trial = json.loads((tmp_path / "eval" / "e" / "results.jsonl").read_text().splitlines()[0])
    assert trial["transcript"][0]["content"].startswith("You are an agent in a Linux shell")

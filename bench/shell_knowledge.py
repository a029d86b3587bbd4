"""What a model knows of each `shell` template's command, apart from the action format.

    .venv/bin/python bench/shell_knowledge.py [--checkpoint tinker://...] [--per-template 3]

For each template (trained and held out), a few held-out instances: the agent's first turn,
its reply forced to begin with a ```bash block, decoded greedily up to the block's end; that
one command runs in the instance's sandbox and the checker grades it. An untrained model that
writes prose instead of commands scores 0 in `tinkrl eval` whatever it knows; here the format
is given, so a score says whether the model can write the command itself. Prints each
template's score and each reply, then the trained and held-out templates' means.
"""

from __future__ import annotations

import argparse
import dataclasses

import tinker

from tinkrl.agents.session import TaskSession
from tinkrl.envs.shell.config import ShellEnvConfig
from tinkrl.envs.shell.tasks import held_out, to_task
from tinkrl.envs.shell.templates import HELD_OUT_TEMPLATES, TRAIN_TEMPLATES, Instance
from tinkrl.local import ServiceClient
from tinkrl.local.model_files import DEFAULT_MODEL
from tinkrl.renderers import get_renderer
from tinkrl.sandbox import get_provider
from tinkrl.taskdirs import apply_solution, grade, start_sandbox

OPENING = "```bash\n"


def first_command(sampler, renderer, tokenizer, inst: Instance, max_tokens: int) -> str:
    """The model's first command for `inst`, its reply started as a bash block, greedy, after the first
    messages an episode of the shell environment opens with."""
    messages = TaskSession(to_task(inst), ShellEnvConfig(), provider=None).first_messages()
    prompt = renderer.build_generation_prompt(messages).to_ints()
    prompt += tokenizer.encode(OPENING, add_special_tokens=False)
    params = tinker.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=["```"])
    out = sampler.sample(tinker.ModelInput.from_ints(prompt), 1, params).result()
    return tokenizer.decode(out.sequences[0].tokens).split("```")[0].strip()


def score(inst: Instance, command: str, provider) -> float:
    """The checker's reward after running `command` in a fresh sandbox of `inst`."""
    task = to_task(dataclasses.replace(inst, solution=[command or "true"]))
    with start_sandbox(task, provider) as sandbox:
        apply_solution(task, sandbox)
        return grade(task, sandbox).reward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--checkpoint", help="a sampler checkpoint (tinker://... or a path) instead of the base model")
    ap.add_argument("--per-template", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    service = ServiceClient(dtype="float32")
    sampler = service.create_sampling_client(model_path=args.checkpoint, base_model=args.model)
    tokenizer = sampler.get_tokenizer()
    renderer = get_renderer(tokenizer, args.model)
    provider = get_provider("bwrap")
    means = {}
    for group, templates in (("trained", TRAIN_TEMPLATES), ("held out", HELD_OUT_TEMPLATES)):
        scores = []
        for inst in held_out(list(templates), args.per_template, args.seed):
            command = first_command(sampler, renderer, tokenizer, inst, args.max_tokens)
            reward = score(inst, command, provider)
            scores.append(reward)
            print(f"{group:8s}  {inst.template:18s}  {reward:.0f}  ref {inst.commands[0]!r}  got {command!r}")
        means[group] = sum(scores) / len(scores)
    for group, mean in means.items():
        print(f"{group} templates: {mean:.3f} of first commands right")


if __name__ == "__main__":
    main()

"""Which templates still teach a run something, so that its train stream can draw the others less often.

A GRPO group whose attempts all score the same (every one solved, or none) has no advantage and
teaches nothing; late in a run many templates are solved every time and a few are never solved.
`GroupTally` keeps, per RL step, each group's template and whether its rewards were constant, and
turns the last few groups of each template into draw weights: a template whose recent groups were
all constant comes up `1 - downweight` as often as one whose groups still split. The tally of a
resumed run is read back from its `episodes/step_*.jsonl`, so batch `k` is weighed by the same
outcomes of the steps before `k` as in the run that was interrupted.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

from tinkrl.envs.shell.tasks import template_of
from tinkrl.rl.types import TrajectoryGroup

RECENT_GROUPS = 4  # groups per template that decide whether it still teaches the run


class GroupTally:
    """Per RL step, (template, rewards all equal) for each of its groups."""

    def __init__(self) -> None:
        self.by_step: dict[int, list[tuple[str, bool]]] = {}

    def record(self, step: int, groups: list[TrajectoryGroup]) -> None:
        """Note `step`'s groups (a group without a finished attempt, or not from this family, is left out)."""
        outcomes = []
        for group in groups:
            task = group.trajectories_G[0].logs.get("tasks/task") if group.trajectories_G else None
            template = template_of(task or "")
            if template is not None:
                outcomes.append((template, len(set(group.total_rewards())) == 1))
        self.by_step[step] = outcomes

    def load(self, episodes_dir: Path) -> None:
        """Read the outcomes of the steps a run already logged (its `episodes/step_*.jsonl` rows)."""
        for path in sorted(episodes_dir.glob("step_*.jsonl")):
            groups: dict[int, tuple[str, set[float]]] = {}
            for line in path.read_text().splitlines():
                row = json.loads(line)
                template = template_of(row.get("tasks/task") or "")
                if template is not None and "reward" in row:
                    groups.setdefault(row["group"], (template, set()))[1].add(row["reward"])
            self.by_step[int(path.stem.removeprefix("step_"))] = [(t, len(r) == 1) for t, r in groups.values()]

    def constant_shares(self, templates: list[str], before: int) -> dict[str, float | None]:
        """Per template, the share of its last `RECENT_GROUPS` groups (of steps before `before`) whose
        rewards were all equal; None for a template with no group yet."""
        recent: dict[str, deque[bool]] = {t: deque(maxlen=RECENT_GROUPS) for t in templates}
        for step in sorted(s for s in self.by_step if s < before):
            for template, constant in self.by_step[step]:
                if template in recent:
                    recent[template].append(constant)
        return {t: (sum(r) / len(r) if r else None) for t, r in recent.items()}

    def weights(self, templates: list[str], before: int, downweight: float) -> list[float]:
        """Draw weights for `templates` at batch `before`: 1 - downweight x its constant share."""
        shares = self.constant_shares(templates, before)
        return [1.0 - downweight * (shares[t] or 0.0) for t in templates]

"""A multi-turn verifiers env made for the tests: the agent answers its task, then a scripted user asks a follow-up."""

from __future__ import annotations

import verifiers.v1 as vf

__all__ = ["FollowUpEnv"]


class FollowUpEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class FollowUpEnv(vf.Env[FollowUpEnvConfig]):
    """A multi-turn env: the agent answers the task, then a scripted user asks a follow-up it answers too."""

    async def run(self, task, agents) -> None:
        async with agents.agent.interaction(task) as chat:
            first = await chat.turn()
            if not first.terminated:
                await chat.turn("Now double it.")

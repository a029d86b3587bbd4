"""Run in the harness virtualenv: tinkrl's terminal-bench agent plays one episode in a terminal-bench
`TmuxSession` on a real container (reached through the Docker API), then its sandbox is probed.

    python tb_session_episode.py DOCKER_URL CONTAINER_ID MODEL CHECKPOINT LOGGING_DIR

terminal-bench's own harness would make the container with docker compose; here the test makes it
(podman serving the Docker API) and everything from the session on is terminal-bench's and tinkrl's
own code. Prints one JSON object: the agent's result, and what its container sandbox did.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import docker
from terminal_bench.terminal.tmux_session import TmuxSession

from tinkrl.agents.tools import run_tool
from tinkrl.harness.terminal_bench import ContainerSandbox, TinkrlTbAgent


def main() -> None:
    """Play the episode and print the JSON summary."""
    url, container_id, model, checkpoint, logging_dir = sys.argv[1:6]
    container = docker.DockerClient(base_url=url).containers.get(container_id)
    session = TmuxSession("agent", container, disable_recording=True)
    session.start()
    agent = TinkrlTbAgent(model_name=model, checkpoint_path=checkpoint, max_turns=2, max_tokens_per_turn=8)
    result = agent.perform_task("Create /app/hello.txt containing Hello, world!", session, Path(logging_dir))
    session.send_keys(["echo from-tmux > /app/tmux.txt", "Enter"], block=True, max_timeout_sec=30)
    sandbox = ContainerSandbox(container, "/app")
    failing = sandbox.exec("echo out; echo err >&2; exit 3")
    sandbox.write_file("/app/sub/note.txt", "written\n")
    bash_obs, _ = run_tool(sandbox, "execute_bash", {"command": "cat /app/sub/note.txt /app/tmux.txt; pwd"})
    print(
        json.dumps(
            {
                "result": result.model_dump(mode="json"),
                "exit_code": failing.exit_code,
                "stdout": failing.stdout,
                "stderr": failing.stderr,
                "read_back": sandbox.read_file("/app/sub/note.txt").decode(),
                "tool_observation": bash_obs,
                "tmux_alive": session.is_session_alive(),
            }
        )
    )


if __name__ == "__main__":
    main()

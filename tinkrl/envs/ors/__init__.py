"""The Open Reward Standard (ORS), both ways, through the `openreward` SDK.

Training on remote environments (`environments: {Owner/Env: {...}}`, or `base_url:`):
- `client.py`: reaching one remote environment and one episode's session on it.
- `env.py`: the config the registry names (`OpenRewardEnvConfig`), the token-level episode,
  its group builder and dataset, and building them from an `environments:` entry.
- `upload.py`: sending finished trajectories to OpenReward's rollout API.

Serving tinkrl's own environments (`tinkrl serve env`):
- `server.py`: the command and the math environments.
- `task_server.py`: agent tasks, one `TaskSession` per ORS session.
"""

import os

# The SDK checks PyPI for a newer version when a client or server is made; every module here
# uses the SDK, and tinkrl makes no network calls beyond the servers a user configures.
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

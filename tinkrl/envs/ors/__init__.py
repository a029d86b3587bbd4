"""Training on remote environments over the Open Reward Standard (ORS), through the `openreward` SDK.

`environments: {Owner/Env: {...}}`, or `base_url:`:
- `client.py`: reaching one remote environment and one episode's session on it.
- `env.py`: the config the registry names (`OpenRewardEnvConfig`), the episode as a message
  session, its group builder and dataset, and building them from an `environments:` entry.
- `upload.py`: sending finished trajectories to OpenReward's rollout API.

Serving tinkrl's own environments over ORS (`tinkrl serve env`) is `tinkrl.env_server`.
"""

import os

# The SDK checks PyPI for a newer version when a client or server is made; every module here
# uses the SDK, and tinkrl makes no network calls beyond the servers a user configures.
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

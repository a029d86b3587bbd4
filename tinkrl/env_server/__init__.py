"""`tinkrl serve env`: tinkrl's own environments served over the Open Reward Standard.

- `app.py`: the server app, its key check and the math environments.
- `tasks.py`: agent tasks, one `TaskSession` per ORS session.

The environments it serves are the environments layer's; other trainers and machines reach them
as ORS environments (tinkrl's own client side is `tinkrl.envs.ors`).
"""

import os

# The SDK checks PyPI for a newer version when a server is made; tinkrl makes no network calls
# beyond the servers a user configures.
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

"""The trainer's rollout-upload hooks, at the path `tinkrl/rl/train.py` names; they live in `tinkrl.envs.ors.upload`."""

from tinkrl.envs.ors.upload import close_uploads, upload_rollouts

__all__ = ["close_uploads", "upload_rollouts"]

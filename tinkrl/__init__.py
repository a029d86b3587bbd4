"""tinkrl: train LLM agents with reinforcement learning through the Tinker API.

The hosted Tinker service (`backend=tinker`) or the embedded engine in `tinkrl.local`
(`backend=local`, the default) sit behind the same three client objects; see docs/design.md.
"""

__version__ = "0.1.0"

"""`verifiers` environments (Prime Intellect's library) as a source in the `environments:` map.

`config.py` holds the light config (no verifiers import), `env.py` the builder that runs each
rollout through verifiers against the run's OpenAI-compatible server, `harness.py` the in-process
chat harness those rollouts use by default.
"""

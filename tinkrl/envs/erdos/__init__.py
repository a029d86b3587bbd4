"""Test-time RL for discovery on Erdős' minimum-overlap problem (`env=erdos`).

- `env.py`: the config the registry names (`ErdosEnvConfig`), the episode, the search state
  shared by a run's groups, and the dataset of groups.
- `buffer.py`: the reuse buffer of best constructions (greedy or PUCT choice of starts).
- `runner.py`: runs model-written programs in a sandbox and reads back the construction.
- `overlap.py`: the C₅ overlap bound of a construction, exact cross-check and validation.
"""

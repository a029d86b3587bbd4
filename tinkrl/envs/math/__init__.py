"""Single-turn math environments (`env=arithmetic`, gsm8k, math500, hendrycks, polaris).

- `env.py`: the config the registry names (`MathEnvConfig`), the episode, its group builder
  and the train/test datasets of groups.
- `arithmetic.py`: synthetic `a op b` problems with a hash-based train/test split.
- `datasets.py`: GSM8K / MATH / Polaris read offline (local files or the HF cache) into problems.
- `grading.py`: final-answer extraction and equivalence (a fast path, then math-verify in a
  worker process pool with timeouts).
- `problems.py`: the problem record and the seeded RNG the draws share.

Nothing is imported here: the grader's worker processes are spawned and import
`grading.py` through this package, and they should not pay for the env's imports.
"""

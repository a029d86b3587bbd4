"""The RL trainer: env contracts (`types.py`), rollouts, advantages, datums, evaluation and the loop (`train.py`)."""

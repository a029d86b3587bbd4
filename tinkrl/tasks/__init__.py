"""The task commands named by `tinkrl/cli.py`: `tinkrl eval` (eval.py) and `tinkrl tasks` (cli.py).

Task directories themselves (loading, sandbox preparation, the verifier, the gate) live in
`tinkrl.taskdirs`.
"""

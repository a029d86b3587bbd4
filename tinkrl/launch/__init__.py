"""Launching a command where the compute is: one Beaker experiment (`beaker.py`, through the official
`beaker-py` client) or one Kubernetes Job (`kubernetes_job.py`, through the official `kubernetes`
client), both from the current git checkout; `common.py` holds what both need (the `KEY=VALUE ... --
COMMAND` line, the git commit and dirty check, the API-key names passed as secrets).

`tinkrl launch` (`tinkrl/commands/launch.py`) is the command line over these.
"""

"""Agents in sandboxes: the tools they call (`tools.py`) and the task session on chat messages (`session.py`)."""

"""The agent-task environment: tool-using agents on task directories in sandboxes (config.py, env.py)."""

"""`env=external_agent`: rollouts that are runs of an unmodified agent program (mini-swe-agent or any command)."""

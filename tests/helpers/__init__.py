"""Shared test code: engine helpers, ORS servers, podman, a fake Kubernetes API, scripted envs."""

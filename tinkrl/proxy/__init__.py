"""OpenAI-compatible server over a SamplingClient, with token capture for training black-box agents.

- `server.ProxyServer` / `serve_in_thread`: the HTTP server (`tinkrl serve openai`).
- `capture`: what was sampled, per rollout; calls -> `Trajectory` + merge statistics.
- `external_agents`: run an external agent (a Python callable or a command) per rollout and get its
  trajectory back, rewarded by a grader.
"""

"""OpenAI-compatible server over a SamplingClient, with token capture for training black-box agents.

- `server.ProxyServer` / `serve_in_thread`: the HTTP server (`tinkrl serve openai`).
- `capture`: what was sampled, per rollout; calls -> `Trajectory` + merge statistics.

Running agent programs against it per rollout is the environments' job (`envs/external_agent/`).
"""

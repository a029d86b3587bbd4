"""tinkrl inside Harbor and terminal-bench: an agent, an environment, and the policy loop they share.

These modules run in the harness virtualenv (`make harness`: `.venv-harness`, Python >= 3.12, with
`harbor` and `terminal-bench`), where tinkrl is installed without its dependencies: they import
only tinkrl's torch-free parts (renderers, action formats, tools, task dirs, the bwrap sandbox) plus
the Tinker SDK and a tokenizer.

    harbor_env.BwrapEnvironment   `harbor run --environment-import-path tinkrl.harness.harbor_env:BwrapEnvironment`
    harbor_agent.TinkrlAgent      `harbor run --agent-import-path tinkrl.harness.harbor_agent:TinkrlAgent`
    terminal_bench.TinkrlTbAgent  `tb run --agent-import-path tinkrl.harness.terminal_bench:TinkrlTbAgent`
    policy                        a Tinker checkpoint sampled turn by turn with tinkrl's renderers and
                                  action formats, recording prompt tokens, sampled tokens and logprobs
"""

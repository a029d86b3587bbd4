"""The run config: one pydantic model, loaded from YAML plus dotted `key=value` overrides.

`tinkrl train [CONFIG.yaml] [key=value ...]` (or `--config_path X.yaml --overrides a=b c=d`).
The config may be written in tinkrl's own keys or in a seed trainer's dialect (`tinkrl.dialects`:
the tinking key=value command line, the OpenReward trainer's tinker-config.yaml); all of them
load into this one model. Unknown keys and bad values fail before any work with one line naming
the key and what is allowed (`ConfigError`, exit code 2); a missing or malformed file names the
file and line.

Environments have one canonical shape, the `environments:` map (the OpenReward seed's form):
each key names an environment (one of tinkrl's own, e.g. `arithmetic`, or a remote
`Owner/Env`), with per-environment `weight`, `num_rollouts` (its group size),
`max_failing_rollouts`, `temperature`, `reward_reduction`, `nonterminal_reward`, `splits`,
and its own fields under `env:`. `env=NAME env.x=...` is sugar for a one-entry map.
Groups per step = `groups_per_step`, else batch_size / group_size, split across environments in
proportion to `weight` (equal by default).
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from tinkrl.dialects import DIALECTS, Pair, detect, to_tinkrl, top_level_pairs
from tinkrl.errors import ConfigError


class Strict(BaseModel):
    """A config section: unknown keys are errors; each field's docstring is its user documentation."""

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, use_attribute_docstrings=True, coerce_numbers_to_str=True
    )


class SplitConfig(Strict):
    """How one split of an environment's tasks is used."""

    shuffle: bool = True
    """Shuffle the split's tasks (per epoch for training splits)."""
    num_samples: int | None = None
    """Use only this many of the split's tasks (None: all of them)."""


class EnvEntry(Strict):
    """One environment in the `environments:` map."""

    type: str | None = None
    """tinkrl environment type (math, tasks, erdos, openreward, or a preset such as arithmetic);
    default: the map key."""
    name: str | None = None
    """Remote (ORS) environment name, when it differs from the map key."""
    base_url: str | None = None
    """ORS server of a remote environment; None: OpenReward's hosted service."""
    weight: float = Field(1.0, gt=0)
    """Share of each step's groups, relative to the other environments' weights."""
    num_rollouts: int | None = Field(None, ge=1)
    """Rollouts per task (this environment's group size); None: the run's group_size."""
    max_failing_rollouts: int = Field(0, ge=0)
    """A group with more infrastructure failures than this is dropped (and counted)."""
    temperature: float | None = Field(None, ge=0)
    """Sampling temperature for this environment; None: the run's temperature."""
    reward_reduction: Literal["sum", "mean", "max", "min"] = "sum"
    """How an ORS episode's tool-call rewards combine into its reward."""
    nonterminal_reward: float = 0.0
    """Added to an ORS episode's reward when it never finishes."""
    splits: dict[str, SplitConfig] = Field(default_factory=lambda: {"train": SplitConfig()})
    """The environment's splits to use; a test/validation/eval split is the held-out set."""
    env: dict[str, Any] = Field(default_factory=dict)
    """The environment's own fields (see its config class)."""


class DocentConfig(Strict):
    """Exporting episodes to Docent (Transluce) while training: `tinkrl export traces` every N steps."""

    export_every: int = Field(0, ge=0)
    """Every N steps, the episodes of the steps since the last export become Docent agent runs; 0: never.
    Uploaded when DOCENT_API_KEY is set, else written to <run_dir>/docent/steps_A-B.json."""
    collection: str | None = None
    """Docent collection name or id; None: the run's name."""


class WandbConfig(Strict):
    """Weights & Biases logging (metrics.jsonl is always written)."""

    enabled: bool = False
    """Log each step's metrics to W&B (needs the wandb package and a login)."""
    entity: str | None = None
    """W&B entity (team or user); None: your default entity."""
    project: str | None = None
    """W&B project; None: tinkrl."""
    run_name: str | None = None
    """W&B run name; None: the run's name."""


class AsyncConfig(Strict):
    """Off-policy sampling: the next steps' rollouts are sampled while this step trains."""

    max_steps_off_policy: int = Field(1, ge=1)
    """Sampling weights are never more than this many optimizer steps old."""


class WarmStartConfig(Strict):
    """Supervised steps (cross_entropy through the same Tinker API) before RL, on reference transcripts."""

    steps: int = Field(0, ge=0)
    """Supervised steps before the first RL step (0: no warm start). Runs once, in a new run only."""
    batch_size: int = Field(32, ge=1)
    """Transcripts per supervised step."""
    learning_rate: float = Field(1e-3, gt=0)
    """Adam learning rate of the supervised steps."""
    demonstrations: int = Field(256, ge=1)
    """Reference transcripts to gather from the environments that have them (e.g. shell: its templates'
    reference solutions, run in sandboxes and kept only when they score 1)."""
    data: str | None = None
    """A JSONL file of conversations ({"messages": [...]} per line) to train on instead of the environments'
    own demonstrations."""
    base_eval: Literal["full", "sample", "off"] = "full"
    """The untrained model's eval before the warm start (the `base` line of warm_start.jsonl): the full
    held-out eval, the in-run eval's fixed sample (eval_sample_size), or none. Its result is kept in
    $TINKRL_HOME/cache/evals per model, held-out set and eval settings, and a later run with the same ones
    reads it from there instead of evaluating again."""


class TeacherConfig(Strict):
    """`teacher.*`: on-policy distillation. The student samples; the teacher scores every sampled token, and
    the per-token reverse KL to it is the advantage (`teacher=MODEL` is sugar for `teacher.model`)."""

    model: str | None = None
    """The teacher: a model name, a `tinker://` checkpoint, a checkpoint directory, or a tinkrl run directory
    (its last sampler checkpoint). None: no teacher (plain RL)."""
    base_model: str | None = None
    """The teacher's base model, when its checkpoint does not say (a hosted `tinker://` checkpoint): the plan
    checks that it tokenizes as the student does."""
    kl_coef: float = Field(1.0, gt=0)
    """Weight of the per-token reverse KL to the teacher in the advantages."""
    kl_discount_factor: float = Field(0.0, ge=0, lt=1)
    """Each token's KL term also counts the later tokens' terms, discounted by this factor (0: each token's own)."""
    reward_coef: float = Field(0.0, ge=0)
    """Weight of the environment's reward advantages beside the teacher's (0: pure distillation, no reward)."""


class DPOConfig(Strict):
    """`dpo.*`: `tinkrl dpo` trains on preference pairs with the DPO loss against a frozen reference. Each step
    takes `batch_size` pairs; `max_steps`, `learning_rate`, `lr_schedule`, `save_every`, `lora_rank` and the
    held-out eval of `environments:` (before the first step and after the last) are the run's own keys."""

    pairs: str | None = None
    """The pairs: a JSONL file (one pair per line: `prompt` or `conversation`/`messages`, then `chosen` and
    `rejected`, each a string, a message or a message list; HH-RLHF's two transcripts; UltraFeedback's message
    lists), a Hugging Face dataset as `hf:NAME` (read through `datasets`), or a tinkrl run directory (pairs of
    rollouts of each group it trained, as `group_pairs` says). None: no DPO."""
    split: str = "train"
    """The Hugging Face dataset's split (`hf:NAME` only)."""
    run_steps: int | None = Field(None, ge=1)
    """With a run directory: pair only the rollouts of its first this many steps (an early policy's groups,
    where right and wrong answers both occur). None: every step."""
    group_pairs: Literal["best_worst", "best_each"] = "best_worst"
    """With a run directory: how a group becomes pairs. best_worst: one pair, its best rollout over its worst;
    best_each: its best over every rollout rewarded below it."""
    beta: float = Field(0.1, gt=0)
    """The DPO temperature: how far the policy may move from the reference for a given preference."""
    reference: str = "base"
    """The frozen reference policy: `base` (the base model), a `tinker://` checkpoint, a checkpoint directory
    or a tinkrl run directory (its last sampler checkpoint)."""
    max_length: int = Field(2048, ge=2)
    """Tokens per sequence at most (prompt and completion); longer sequences are cut at the end."""


class BwrapSandboxConfig(Strict):
    """`sandbox.bwrap.*`: the bwrap provider's pool of prestarted sandboxes and its pid-1 server."""

    pool: int = Field(0, ge=0)
    """Fresh sandboxes kept started ahead per recently used spec (each handed out once)."""
    server: Literal["auto", "native", "python"] = "auto"
    """pid 1 in the sandbox: the compiled bwrap_init.c (native), bwrap_server.py (python), or native when a C
    compiler is there (auto)."""


DEFAULT_MAX_OUTPUT = 64 * 1024  # bytes of a command's stdout (and of its stderr) a sandbox keeps, head + tail


class DockerSandboxConfig(Strict):
    """`sandbox.docker.*`: how the docker provider reaches its engine and shapes containers."""

    base_url: str | None = None
    """Engine socket, e.g. unix:///run/podman/podman.sock; default: $DOCKER_HOST, else the
    first of /var/run/docker.sock and /run/podman/podman.sock that exists."""
    image: str | None = None
    """Image for tasks that name none (a task's own image always wins)."""
    pull: Literal["missing", "always", "never"] = "missing"
    """When to pull the image before starting a container."""
    network: str = "bridge"
    """Network for tasks that ask for one (tasks that don't get network_mode none)."""
    run_id: str | None = None
    """Labels every container; default: a fresh id per provider."""
    ttl_s: float = Field(default=6 * 3600, gt=0)
    """A container older than this is a leak whatever its owner; the reaper removes it."""
    max_output_bytes: int = Field(default=DEFAULT_MAX_OUTPUT, gt=16)
    """Kept per stream and command (head + tail)."""
    api_timeout_s: float = Field(default=120, gt=0)
    """Timeout of one Engine API call (not of commands)."""
    reap_on_start: bool = True
    """Remove leaked tinkrl containers of dead owners on this host when the provider starts."""
    no_new_privileges: bool = True
    """Run containers with no-new-privileges (setuid binaries don't raise privileges)."""


class KubernetesSandboxConfig(Strict):
    """`sandbox.kubernetes.*`: where sandbox pods go and what they look like."""

    namespace: str = "default"
    """Namespace of the sandbox pods (the Helm chart's Role covers exactly this one)."""
    kubeconfig: str | None = None
    """Kubeconfig file; default: in-cluster config inside a pod, else ~/.kube/config."""
    context: str | None = None
    """Kubeconfig context (default: its current-context)."""
    image: str | None = None
    """Image for tasks that name none (a task's own image always wins)."""
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    image_pull_secrets: list[str] = Field(default_factory=list)
    """Names of docker-registry Secrets in the namespace (e.g. for a private mirror / ECR)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """e.g. {"tinkrl.dev/pool": "sandbox"}: keeps sandboxes on the sandbox node group."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    """Pod tolerations, as in a pod spec (to land on tainted sandbox nodes)."""
    service_account: str | None = None
    """Service account of sandbox pods; its token is never mounted."""
    run_as_user: int | None = 0
    """securityContext.runAsUser (0: task images expect root); None leaves the image's user."""
    cpu_limit_factor: float = Field(default=2.0, ge=1.0)
    """CPU limit = the task's CPU request × this (bursting helps builds and test runs)."""
    memory_limit_factor: float = Field(default=1.0, ge=1.0)
    """Memory limit = the task's memory request × this."""
    ready_timeout_s: float = Field(default=600.0, gt=0)
    """How long a pod may take to run (image pulls dominate: large images need minutes)."""
    max_concurrent: int = Field(default=64, ge=1)
    """At most this many live sandbox pods per provider; create() waits for a free slot."""
    ttl_s: float = Field(default=6 * 3600, gt=0)
    """Pods older than this are leaks: activeDeadlineSeconds and the reaper's expires-at."""
    run_id: str | None = None
    """Label of every pod of this run; default: a fresh id per provider."""
    request_timeout_s: float = Field(default=60.0, gt=0)
    """Timeout of one API request (not of commands)."""
    poll_interval_s: float = Field(default=1.0, gt=0)
    """Readiness polling period."""
    max_output_bytes: int = Field(default=DEFAULT_MAX_OUTPUT, gt=16)
    reap_on_start: bool = False
    """Reap leaked pods of dead runs in the namespace when the provider starts."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels on every sandbox pod (e.g. for NetworkPolicies or cost allocation)."""


class HarborSandboxConfig(Strict):
    """`sandbox.harbor.*`: which of Harbor's environments runs the sandboxes, and how many at once."""

    environment: str = "docker"
    """A Harbor environment type (docker, daytona, modal, e2b, runloop, ...) or an import path module:Class."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """The environment's own options, as `harbor run --ek key=value` gives them."""
    python: str | None = None
    """An interpreter with Harbor installed; default: $TINKRL_HARNESS_PYTHON, else .venv-harness (make harness)."""
    image: str = "ubuntu:24.04"
    """Base image of sandboxes whose task names none (its workspace is then built in the sandbox)."""
    max_concurrent: int = Field(default=16, ge=1)
    """At most this many live sandboxes per run; create() waits for a free slot."""
    start_retries: int = Field(default=3, ge=0)
    """Further tries of a start that failed on the provider's side (a definition that does not build is not retried)."""
    retry_backoff_s: float = Field(default=5.0, ge=0)
    """Wait before the first retry, doubled for each one after."""
    start_timeout_s: float = Field(default=900.0, gt=0)
    """How long one start (image build or pull included) may take."""
    run_id: str | None = None
    """Names the run's sandboxes; default: a fresh id per provider."""
    max_output_bytes: int = Field(default=DEFAULT_MAX_OUTPUT, gt=16)
    """Kept per stream and command (head + tail)."""
    ledger: str | None = None
    """Where the bridge records each live sandbox for `tinkrl sandbox reap --provider harbor`; default
    $TINKRL_HOME/sandboxes/harbor (~/.tinkrl/sandboxes/harbor)."""
    reap_on_start: bool = True
    """Before the first sandbox, stop those recorded by bridges that are gone (killed with SIGKILL)."""


class SandboxConfig(Strict):
    """`sandbox.*`: which provider runs the sandboxes, and each provider's options."""

    provider: Literal["bwrap", "docker", "kubernetes", "harbor"] = "bwrap"
    """bwrap: bubblewrap on this machine (the default); docker or kubernetes: containers or pods for scale-out;
    harbor: one of Harbor's environments (Daytona, Modal, E2B, Runloop, docker, ...)."""
    bwrap: BwrapSandboxConfig = Field(default_factory=BwrapSandboxConfig)
    """Options of the bwrap provider."""
    docker: DockerSandboxConfig = Field(default_factory=DockerSandboxConfig)
    """Options of the docker provider."""
    kubernetes: KubernetesSandboxConfig = Field(default_factory=KubernetesSandboxConfig)
    """Options of the kubernetes provider."""
    harbor: HarborSandboxConfig = Field(default_factory=HarborSandboxConfig)
    """Options of the harbor provider."""

    def provider_options(self) -> dict[str, Any]:
        """The chosen provider's options, as keyword arguments for `sandbox.get_provider`."""
        return getattr(self, self.provider).model_dump()


class OpenRewardConfig(Strict):
    """OpenReward's rollout API."""

    upload: bool = False
    """Upload the ORS environments' trajectories to OpenReward (needs OPENREWARD_API_KEY)."""
    run_name: str | None = None
    """Run name on OpenReward; None: the run's name."""


ADV_ESTIMATORS = (
    "grpo",
    "grpo_std",
    "direct",
    "rloo",
    "entropic",
    "entropic_adaptive",
    "centered",
    "centered_normalized",
)
RL_LOSSES = ("importance_sampling", "ppo", "cispo", "dro", "gspo")
LOSSES = (*RL_LOSSES, "cross_entropy")


class BackendConfig(Strict):
    """Which model, served by which implementation of the Tinker API (`tinkrl.backends`)."""

    model_name: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    """Base model: a Tinker model name, a Hugging Face id (the local engine reads it from the HF cache), a local
    HF directory or a .gguf file."""
    backend: Literal["auto", "local", "tinker"] = "auto"
    """local: the embedded engine in this process; tinker: the Tinker service through the official SDK; auto:
    tinker when TINKER_API_KEY is set and the model is not on this machine (or a Tinker base URL is set),
    else local."""
    thinking: bool | None = None
    """Reasoning models: false switches the renderer to its family's variant without thinking (qwen3 ->
    qwen3_disable_thinking, qwen3_5 -> qwen3_5_disable_thinking, deepseekv4_1 -> deepseekv4_1_disable_thinking,
    ...), true to the one with it; families that always or never think (gpt-oss, GLM-5.3, Llama) keep theirs.
    None: the renderer as chosen."""
    renderer: str | None = None
    """Chat format, by tinker-cookbook's names (qwen3, qwen3_5, qwen3_8_xhigh_reasoning, deepseekv4_1,
    glm5_3_max_reasoning, gpt_oss_no_sysprompt, kimi_k25, nemotron3, llama3, role_colon, tml_v0, ...; `tinkrl
    render --help` and the README list them all) or tinkrl's own (chatml, smollm2, qwen2); earlier names stay
    aliases (qwen3_no_thinking, gpt_oss, deepseek_v3). None: tinker-cookbook's recommendation for model_name."""
    base_url: str | None = None
    """Tinker service URL (backend=tinker); default: $TINKER_BASE_URL, else the hosted service."""
    device: str | None = None
    """Local engine device: cuda or cpu; None: cuda when present."""
    precision: Literal["auto", "float32", "bfloat16"] = "auto"
    """Local engine compute precision; auto: the fastest whose sampler/trainer logprobs agree on this device."""
    sampler_precision: Literal["auto", "matched", "bfloat16"] = "auto"
    """Local engine sampling: matched runs the trainer's own arithmetic (their logprobs agree); bfloat16
    multiplies bf16 activations by bf16 weights (faster on CPUs with bf16 instructions; the sampler/trainer
    mismatch is reported as optim/dlogprob_*); auto: the measured default of this hardware class."""
    compile: bool = False
    """Local engine: torch.compile the training forward (faster steps after a one-time compile)."""


class TrainConfig(BackendConfig):
    """Everything a training run needs; `tinkrl train --help` prints these fields' docs."""

    lora_rank: int = Field(32, ge=1)
    """LoRA rank."""
    learning_rate: float = Field(4e-4, gt=0)
    """Adam learning rate. Under a decaying lr_schedule, its value at the first step."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The learning rate over the run: constant, or linear/cosine decay to 0 at its end (the end is
    max_steps, or where time_budget_s will stop the run, estimated from the pace of the steps after
    the first)."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.95
    """Adam beta2."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW)."""
    grad_clip_norm: float = 0.0
    """Clip the gradient to this global norm; 0: no clipping (the norm is reported regardless)."""
    batch_size: int = Field(64, ge=1)
    """Rollouts per step, a multiple of group_size: batch_size / group_size groups per step."""
    groups_per_step: int | None = Field(None, ge=1)
    """Task groups per step, split across environments by weight (instead of batch_size; the openreward
    dialect's batch_size)."""
    group_size: int = Field(8, ge=1)
    """Rollouts per task (a GRPO group), unless an environment sets num_rollouts."""
    max_steps: int = Field(20, ge=0)
    """Training steps (alias: num_batches)."""
    time_budget_s: float | None = Field(None, gt=0)
    """Stop early, with the final eval and checkpoint, so the run ends within this many seconds."""
    max_tokens: int = Field(256, ge=1)
    """Tokens sampled per turn."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature (0: greedy)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold."""
    loss_fn: Literal[LOSSES] = "importance_sampling"  # type: ignore[valid-type]
    """Tinker loss: importance_sampling, ppo, cispo, dro, gspo or cross_entropy."""
    loss_fn_config: dict[str, float] | None = None
    """The loss's options, e.g. clip_low_threshold / clip_high_threshold (ppo, cispo), beta (dro)."""
    adv_estimator: Literal[ADV_ESTIMATORS] = "grpo"  # type: ignore[valid-type]
    """How group rewards become advantages (an environment may choose another default, e.g. erdos: entropic)."""
    adv_beta: float = 2.0
    """The entropic estimator's beta."""
    kl_penalty_coef: float = 0.0
    """Coefficient of the KL to the reference policy (`kl_reference`), added to the advantages (0: off)."""
    kl_reference: Literal["base", "warm_start"] = "base"
    """The policy the KL penalty pulls toward: the base model, or the weights the warm start ended with
    (saved as the run's `warm_start` sampler checkpoint; needs warm_start.steps > 0)."""
    remove_constant_reward_groups: bool = False
    """Leave out groups whose rollouts all got the same reward (they carry no signal; off with a teacher,
    whose per-token advantages carry it)."""
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    """On-policy distillation from a teacher model (`teacher=MODEL`); off unless teacher.model is set."""
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    """Preference pairs for `tinkrl dpo` (`dpo.pairs`); `tinkrl train` refuses them."""
    save_every: int = Field(10, ge=0)
    """Steps between checkpoints; 0: only the final one."""
    eval_every: int = Field(10, ge=0)
    """Steps between held-out evals; 0: only at the end."""
    eval_problems: int = Field(100, ge=0)
    """Held-out problems per eval."""
    eval_sample_size: int | None = Field(None, ge=1)
    """In-run evals on a fixed sample of this many held-out problems per environment (drawn once from the
    run's seed, spread over the held-out tags), greedy only, with their standard error (`eval_sample/...`);
    the full held-out eval then runs only before the first RL step and after the last. None: every eval is
    a full one."""
    eval_modes: list[Literal["greedy", "sampled"]] = Field(default_factory=lambda: ["greedy", "sampled"], min_length=1)
    """How a full eval plays each held-out problem: greedy, one episode sampled at the run's temperature, or
    both (`eval/<key>/{greedy,sampled}_reward`, each with its `_stderr`)."""
    eval_max_share: float | None = Field(None, gt=0, le=1)
    """With time_budget_s: an in-run eval is skipped when it would take all evaluation (what ran so far, it,
    and the final eval's reserve) past this share of the budget. None, or no time_budget_s: no cap."""
    resume_from: str | None = None
    """Start a new run from this checkpoint (a state path: tinker://.../weights/... or a directory): its weights
    and optimizer state, at step 0."""
    log_path: str | None = None
    """Run directory; default: <runs_dir>/<run_name>. A run resumes its own checkpoints there; a directory of
    another run (other model, backend or environments) is refused."""
    runs_dir: str = "runs"
    """Where runs without a log_path get their directory (<runs_dir>/<run_name>)."""
    run_name: str | None = None
    """The run's name (run directory, W&B and OpenReward run names); default: a new one per run,
    <environments>-<date>-<time>-<random>."""
    seed: int = 0
    """Seed of data order, sampling and LoRA initialisation."""
    max_concurrent_rollouts: int = Field(256, ge=1)
    """Episodes run at once."""
    environments: dict[str, EnvEntry] = Field(default_factory=dict)
    """The environments to train on, by name (`env=NAME env.field=...` makes a one-entry map)."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """Weights & Biases logging."""
    docent: DocentConfig = Field(default_factory=DocentConfig)
    """Exporting episodes to Docent while training."""
    async_: AsyncConfig | None = Field(None, alias="async")
    """Sample the next steps while training (off-policy by at most max_steps_off_policy); None: synchronous."""
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    """Where agent tasks run: bwrap (default), docker or kubernetes, and each provider's options."""
    openreward: OpenRewardConfig = Field(default_factory=OpenRewardConfig)
    """Uploading ORS trajectories to OpenReward."""
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    """A short supervised phase before RL (off unless warm_start.steps > 0)."""
    dialect: Literal["auto", *DIALECTS] = "auto"  # type: ignore[valid-type]
    """The config's spelling: tinkrl, tinking (key=value trainer) or openreward (tinker-config.yaml); auto: detected
    from keys only one of them has (the run's plan says which)."""
    _dialect_reason: str = PrivateAttr("")

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.groups_per_step is None and self.batch_size % self.group_size and not self.dpo.pairs:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of group_size ({self.group_size})")
        if self.groups_per_step is not None and "batch_size" in self.model_fields_set:
            raise ValueError("set batch_size (rollouts per step) or groups_per_step, not both")
        if self.loss_fn == "cross_entropy":
            raise ValueError(
                "loss_fn: cross_entropy is a supervised loss (it ignores rewards); tinkrl train trains with "
                + ", ".join(RL_LOSSES)
            )
        if self.loss_fn == "dro" and "beta" not in (self.loss_fn_config or {}):
            raise ValueError("loss_fn: dro needs loss_fn_config.beta (the weight of its quadratic penalty), e.g. 0.05")
        if self.kl_reference == "warm_start" and not self.warm_start.steps:
            raise ValueError("kl_reference: warm_start needs a warm start (warm_start.steps > 0); else use base")
        if len(set(self.eval_modes)) != len(self.eval_modes):
            raise ValueError(f"eval_modes: each mode once, got {self.eval_modes}")
        if self.warm_start.base_eval == "sample" and self.eval_sample_size is None:
            raise ValueError("warm_start.base_eval: sample needs eval_sample_size (the sample's size)")
        if self.run_name is None:
            self.run_name = _fresh_run_name(self.environments)
        if not self.environments and not self.dpo.pairs:
            raise ValueError("no environment: set env=NAME or an environments: map")
        for key, entry in self.environments.items():
            n = entry.num_rollouts or self.group_size
            if entry.max_failing_rollouts and n - entry.max_failing_rollouts < 2:
                raise ValueError(
                    f"environments.{key}: num_rollouts - max_failing_rollouts must be >= 2 "
                    f"(got {n} - {entry.max_failing_rollouts})"
                )
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.log_path or Path(self.runs_dir) / (self.run_name or "run")).expanduser()

    def group_size_for(self, key: str) -> int:
        return self.environments[key].num_rollouts or self.group_size

    @property
    def dialect_reason(self) -> str:
        """Why the config was read in its dialect (set by `load_config`)."""
        return self._dialect_reason

    def groups_per_env(self) -> dict[str, int]:
        """Groups per step for each environment, in proportion to weight, at least one each."""
        total_groups = self.groups_per_step or self.batch_size // self.group_size
        weights = {k: e.weight for k, e in self.environments.items()}
        wsum = sum(weights.values())
        return {k: max(1, round(total_groups * w / wsum)) for k, w in weights.items()}


def _fresh_run_name(environments: dict[str, EnvEntry]) -> str:
    """`<environments>-<date>-<time>-<random>`: runs given no name (even started in the same second) never share a
    directory."""
    base = "+".join(re.sub(r"[^A-Za-z0-9._-]+", "-", k) for k in environments)[:60] or "run"
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


# ---------------------------------------------------------------------------------------------
# Loading: YAML + overrides -> TrainConfig, with one-line errors.


def parse_value(text: str) -> Any:
    """A command-line value: YAML scalar rules (true, 1e-4, null, [a, b], {k: v}), except that dates and YAML 1.1's
    yes/no/on/off stay text (a run named 2024-01-01 or `on` keeps its name; boolean fields still read them)."""
    if text.strip().lower() in ("yes", "no", "on", "off", "y", "n"):
        return text
    try:
        value = yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text
    return text if isinstance(value, (datetime.date, datetime.datetime)) else value


def set_dotted(d: dict, dotted: str, value: Any) -> None:
    """Set the key at the dotted path in `d`, making nested dicts on the way (a non-dict in the way is replaced);
    a mapping set where a mapping is merges into it (a YAML section and `section.key=value` overrides combine)."""
    keys = dotted.split(".")
    for k in keys[:-1]:
        nxt = d.get(k)
        if not isinstance(nxt, dict):
            nxt = d[k] = {}
        d = nxt
    if isinstance(value, dict) and isinstance(d.get(keys[-1]), dict):
        merge_mapping(d[keys[-1]], value)
    else:
        d[keys[-1]] = value


def merge_mapping(dst: dict, src: dict) -> None:
    """Merge mapping `src` into `dst`, key by key (keys taken literally, not as dotted paths)."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge_mapping(dst[k], v)
        else:
            dst[k] = v


def load_yaml(path: str | Path) -> dict:
    """A config file's top-level mapping, or a ConfigError naming the file (and the line of a YAML error)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} not found")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}{where}: malformed YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of config keys")
    return data


def parse_overrides(overrides: list[str]) -> list[Pair]:
    """`key=value` command-line overrides as (dotted key, parsed value) pairs."""
    pairs = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value")
        key, text = item.split("=", 1)
        pairs.append((key.strip().lstrip("-"), parse_value(text)))
    return pairs


def apply_pairs(raw: dict, pairs: list[Pair]) -> dict:
    """Apply (dotted key, value) pairs in tinkrl's keys to the raw config dict, in order; returns it.

    `env=NAME`, `env.x=...` and `env_config:` (the YAML spelling of env.*) become a one-entry
    `environments:` map; a later `env=` naming another environment drops the earlier one's fields, and
    an `environments.NAME...` pair after them (a command line's, over a YAML's `env_config:`) wins.
    `teacher=MODEL` is `teacher.model=MODEL`."""
    env_name: str | None = None
    env_fields: dict[str, Any] = {}
    last_sugar = -1  # the last pair of env sugar: `environments.*` pairs after it are applied after it
    for i, (key, value) in enumerate(pairs):
        if key == "groups_per_batch":
            raise ConfigError("groups_per_batch: tinkrl calls it groups_per_step")
        if key == "num_batches":  # the seeds' name for it
            key = "max_steps"
        if key == "env":
            if isinstance(value, (dict, list)):
                raise ConfigError(f"env: must be an environment's name (env=NAME), got {value!r}")
            if env_name is not None and str(value) != env_name:
                env_fields = {}
            env_name, last_sugar = str(value), i
        elif key == "teacher" and not isinstance(value, dict):
            set_dotted(raw, "teacher.model", value)
        elif key == "env_config":
            if not isinstance(value, dict):
                raise ConfigError("env_config: must be a mapping of the environment's fields")
            env_fields.update(value)
            last_sugar = i
        elif key.startswith("env."):
            set_dotted(env_fields, key[4:], value)
            last_sugar = i
        else:
            set_dotted(raw, key, value)
    if env_name or env_fields:
        environments = raw.get("environments")
        if environments is None:  # `environments:` left empty, as YAML reads it
            raw.pop("environments", None)
        elif not isinstance(environments, dict):
            raise ConfigError(f"environments: must be a mapping of names to environments, got {environments!r}")
        if env_name is None:
            if len(raw.get("environments", {})) != 1:
                raise ConfigError("env.* overrides need env=NAME (or exactly one entry in environments:)")
            env_name = next(iter(raw["environments"]))
        known = sorted(raw.get("environments") or {})
        if known and env_name not in known:  # env=NAME may pick one entry of the map, not add another
            raise ConfigError(
                f"env={env_name} and environments.{known[0]} name two environments: use either env=NAME or an "
                "environments: map, not both"
            )
        entry = raw.setdefault("environments", {}).setdefault(env_name, {})
        if not isinstance(entry, dict) or not isinstance(entry.setdefault("env", {}), dict):
            raise ConfigError(f"environments.{env_name}: must be a mapping with an env: mapping, got {entry!r}")
        fields = entry["env"]
        for k, v in env_fields.items():
            set_dotted(fields, k, v)
        raw["environments"] = {env_name: entry}
        for key, value in pairs[last_sugar + 1 :]:  # e.g. a command line's environments.NAME.env.x after env_config
            if key.startswith("environments."):
                set_dotted(raw, key, value)
    return raw


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The config model that holds the key at `loc` (walking fields, Optional and dict values)."""
    import types
    import typing

    cls: Any = TrainConfig
    for part in loc:
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            field = next((f for n, f in cls.model_fields.items() if part in (n, f.alias)), None)
            if field is None:
                return None
            cls = field.annotation
        elif typing.get_origin(cls) is dict:
            cls = typing.get_args(cls)[1]
        else:
            return None
        args = [a for a in typing.get_args(cls) if a is not type(None)]
        if typing.get_origin(cls) in (typing.Union, types.UnionType) and len(args) == 1:
            cls = args[0]
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _format_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "config"
    if err["type"] == "extra_forbidden":
        parent = _model_at(tuple(err["loc"][:-1]))
        allowed = sorted(f.alias or n for n, f in parent.model_fields.items()) if parent else []
        return f"unknown config key {loc!r}; allowed keys here: {', '.join(allowed) or 'see docs'}"
    msg = err["msg"]
    if err["type"] == "value_error":  # our own validators' messages, without pydantic's prefix
        msg = msg.removeprefix("Value error, ")
        return msg if loc == "config" else f"{loc}: {msg}"
    if err["type"] == "literal_error":
        return f"{loc}: {msg} (got {err.get('input')!r})"
    return f"{loc}: {msg}" + (f" (got {err.get('input')!r})" if "input" in err else "")


def load_config(config_path: str | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """YAML file (optional) + `key=value` overrides, in any dialect -> TrainConfig, or a one-line ConfigError.

    The dialect (`tinkrl.dialects`) is read from both together and recorded in `config.dialect`
    (its reason in `config.dialect_reason`). Each environment's own fields are checked by its
    config class (`tinkrl.envs.resolve_config`), not here: this module knows no environment.
    Without a config file, `$TINKRL_CONFIG` is the config file (`default_config_path`)."""
    path = config_path or default_config_path()
    pairs = top_level_pairs(load_yaml(path)) if path else []
    pairs += parse_overrides(list(overrides or []))
    dialect = detect(pairs)
    raw = apply_pairs({}, to_tinkrl(pairs, dialect))
    raw["dialect"] = dialect.name
    try:
        config = TrainConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(e)) from None
    config._dialect_reason = dialect.reason
    return config


CONFIG_ENV = "TINKRL_CONFIG"


def default_config_path() -> str | None:
    """The run config a command uses when it is given none: the file `$TINKRL_CONFIG` names (the Helm chart
    mounts its run config ConfigMap in the orchestrator and in Jobs `tinkrl launch k8s` starts, and points
    the variable at it), else None. `tinkrl train`, `tinkrl eval` and `tinkrl sandbox` all read it, so a
    cluster has one run config."""
    return os.environ.get(CONFIG_ENV) or None


class _SandboxSection(Strict):
    """A run config reduced to its `sandbox:` section (what `tinkrl eval` and `tinkrl sandbox` read)."""

    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)


def load_sandbox_config(config_path: str | None = None, overrides: list[str] | None = None) -> SandboxConfig:
    """The `sandbox:` section of a run config (`config_path`, else `$TINKRL_CONFIG`, else every default) with
    `sandbox.*=value` overrides applied, or a one-line ConfigError. The same section `tinkrl train` reads, so
    training and evaluation put their sandboxes in the same place."""
    path = config_path or default_config_path()
    section = load_yaml(path).get("sandbox") if path else None
    if section is not None and not isinstance(section, dict):
        raise ConfigError(f"{path}: sandbox: must be a mapping (provider, bwrap, docker, kubernetes)")
    raw: dict[str, Any] = {"sandbox": dict(section or {})}
    for key, value in parse_overrides(list(overrides or [])):
        if not key.startswith("sandbox."):
            raise ConfigError(f"{key}: only sandbox.* keys can be set here (e.g. sandbox.kubernetes.namespace=NS)")
        set_dotted(raw, key, value)
    try:
        return _SandboxSection.model_validate(raw).sandbox
    except ValidationError as e:
        raise ConfigError(_format_error(e)) from None


def runs_dir_of(config_path: str | None = None) -> str:
    """`runs_dir` of a run config (`config_path`, else `$TINKRL_CONFIG`), else its default: where commands
    that are not training (`tinkrl eval`) put their results, next to the runs."""
    path = config_path or default_config_path()
    value = load_yaml(path).get("runs_dir") if path else None
    return str(value) if value else str(TrainConfig.model_fields["runs_dir"].default)


def load_dotenv_file(path: str | Path = ".env") -> None:
    """Load API keys from `.env` in the working directory (never overrides the environment)."""
    if Path(path).is_file():
        from dotenv import load_dotenv

        load_dotenv(path, override=False)


def resolved_yaml(config: TrainConfig) -> str:
    """The config as YAML with every default filled in (the run directory's `config.yaml`)."""
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=False)

"""The bwrap warm pool hands out fresh, never-used sandboxes of the asked-for spec, once each."""

import time

import pytest
from helpers.requirements import needs_bwrap

from tinkrl.sandbox import get_provider
from tinkrl.sandbox.base import SandboxSpec

pytestmark = needs_bwrap


def wait_ready(provider, spec: SandboxSpec, n: int = 1, timeout: float = 10.0) -> list:
    from tinkrl.sandbox.bwrap.provider import _pool_key

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with provider.pool.cond:
            ready = list(provider.pool.ready.get(_pool_key(spec), []))
        if len(ready) >= n:
            return ready
        time.sleep(0.01)
    raise AssertionError(f"pool did not fill: {provider.pool.last_error}")


@pytest.fixture
def pooled():
    p = get_provider("bwrap", pool=1)
    yield p
    p.close()


def test_pooled_sandbox_is_fresh_hardened_and_used_once(pooled):
    spec = SandboxSpec(env={"TASK": "one"})
    with pooled.create(spec) as first:  # cold: the spec is new to the pool
        first.exec("echo dirty > /app/mark; echo dirty > /tmp/mark; (sleep 300 &)")
        first_pid = first.proc.pid
    waiting = wait_ready(pooled, spec)[0]
    with pooled.create(SandboxSpec(env={"TASK": "one"})) as second:
        assert second is waiting and second.proc.pid != first_pid
        r = second.exec("ls -A /app /tmp; ps -eo comm | grep -c sleep; echo $TASK; grep CapEff /proc/self/status")
        assert r.stdout.split() == ["/app:", "/tmp:", "0", "one", "CapEff:", "0000000000000000"]
        assert second.exec("unshare -U true").exit_code != 0
    with pooled.pool.cond:  # handed out once: no longer in the pool
        assert all(sb is not second for sbs in pooled.pool.ready.values() for sb in sbs)


def test_pool_never_hands_out_a_sandbox_of_another_spec(pooled):
    app = SandboxSpec()
    pooled.create(app).close()
    wait_ready(pooled, app)
    with pooled.create(SandboxSpec(workdir="/testbed", memory_mb=512)) as other:
        assert other.exec("pwd").stdout == "/testbed\n"
        assert other.spec.memory_mb == 512
    with pooled.create(SandboxSpec(env={"X": "1"})) as with_env:
        assert with_env.exec("echo ${X:-unset}").stdout == "1\n"


def test_closing_the_provider_stops_pooled_sandboxes(pooled):
    spec = SandboxSpec()
    pooled.create(spec).close()
    idle = wait_ready(pooled, spec)
    pooled.close()
    assert idle and all(sb.proc.poll() is not None for sb in idle)  # bwrap exited: the namespace is gone
    with pooled.pool.cond:
        assert not pooled.pool.ready


def test_bad_pool_size_is_refused():
    from tinkrl.errors import ConfigError

    with pytest.raises(ConfigError, match="pool"):
        get_provider("bwrap", pool=-1)

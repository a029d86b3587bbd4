"""The bubblewrap sandbox provider: one hardened bwrap namespace per episode, cheap to start.

tinkrl usually runs as root, and bwrap started by root is no boundary by itself, so each
sandbox is started *as an unprivileged host uid of its own* (a lock file per uid in a
reserved range, so rlimits and cgroups are never shared between concurrent sandboxes) with
a user namespace that maps just that uid to root inside. Inside there are no capabilities
(bounding set empty), no further user namespaces, no network, a new session, a cleared
environment, the system directories read-only, a generated minimal /etc, and size-capped
tmpfs for the workdir, /tmp, /root, /tests and /logs. The host's /root, /home, project and
run directories are never mounted. pid and memory limits come from cgroups (v2 or v1,
whichever is writable), else from rlimits.

The sandbox's pid 1 is `bwrap_init.c`, compiled once per machine (or, without a C
compiler, `bwrap_server.py` run by Debian's /usr/bin/python3 — never the project venv):
it executes each command in its own session with a deadline, keeps the head and tail of
the output, and keeps cwd/exported env between calls like a terminal. Background processes
outlive the command that started them and die with the sandbox. The same binary, run as
root with `--launch`, joins the sandbox's cgroups and drops to its uid before exec'ing
bwrap, so no process of the sandbox ever has to be moved between cgroups.

Modules: `provider` (BwrapProvider, warm pool), `sandbox` (BwrapSandbox: the bwrap command
line and the calls to pid 1), `protocol` (frames to and from pid 1), `build` (pid 1 and
/etc, built once), `uids` (a host uid per sandbox), `cgroups` (pid and memory limits);
`bwrap_server.py` and `bwrap_init.c` run inside the sandbox.
"""

from tinkrl.sandbox.bwrap.provider import BwrapProvider
from tinkrl.sandbox.bwrap.sandbox import BwrapSandbox

__all__ = ["BwrapProvider", "BwrapSandbox"]

#!/usr/bin/env bash
# System packages tinkrl needs outside Python: bubblewrap (the local sandbox), tcmalloc, Debian's python3 +
# pytest (what sandboxed task tests run with: the sandbox never sees our venv), and the tools the
# tests drive (podman, chromium).
set -u
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
[ -x /usr/bin/python3 ] || need+=(python3)
/usr/bin/python3 -c "import pytest" >/dev/null 2>&1 || need+=(python3-pytest)
/usr/bin/python3 -c "import numpy" >/dev/null 2>&1 || need+=(python3-numpy)
/usr/bin/python3 -c "import scipy" >/dev/null 2>&1 || need+=(python3-scipy)  # erdos env: model code may use scipy
command -v git >/dev/null 2>&1 || need+=(git)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)  # bwrap sandbox: native pid 1 (tinkrl/sandbox/bwrap/bwrap_init.c)
command -v g++ >/dev/null 2>&1 || need+=(g++)  # engine compile=true: torch.compile builds C++ kernels on CPU
# the `tinkrl` command's allocator (tinkrl/allocator.py): freed tensor memory reused, not left resident
ls /usr/lib/*/libtcmalloc_minimal.so.4 /usr/lib/libtcmalloc_minimal.so.4 >/dev/null 2>&1 || need+=(libtcmalloc-minimal4)
# docker provider tests: rootful podman (Docker API via `podman system service`), runc (crun
# fails on this kind's cgroup hybrid mode), busybox-static for the test image's root fs
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
[ -x /usr/lib/podman/netavark ] || need+=(netavark iptables)  # podman bridge network (tasks that ask for network)
command -v chromium >/dev/null 2>&1 || need+=(chromium)  # tinkrl view's browser tests (headless, via Playwright)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null && exit 0
  echo "warning: apt-get could not install ${need[*]}; sandboxed tasks will not run" >&2
else
  echo "warning: missing system packages: ${need[*]} (install them with your package manager, e.g. sudo apt-get install ${need[*]}); sandboxed tasks will not run" >&2
fi
exit 0

"""A real container engine for tests: Debian's podman with a test-local config.

No Docker engine runs on this machine kind, but podman does, given runc (crun fails on the
cgroup v1/v2 hybrid here) and no default ulimits. Everything lives under one temp dir
(config via CONTAINERS_CONF / CONTAINERS_STORAGE_CONF, storage, the API socket), so /etc
is never touched. The test image is a busybox root filesystem built here and imported
with `podman import` (there is no registry to pull from). `podman system service` serves
the Docker-compatible API that the docker SDK talks to.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = "/bin/busybox"  # Debian busybox-static (scripts/install-system.sh)
TEST_IMAGE = "localhost/tinkrl-test-busybox:1"
# The same with the host's bash and its libraries (Harbor execs bash), named with a registry: Harbor's stop runs
# `down --rmi local`, and podman-compose takes every localhost/ image for a local build and deletes it.
BASH_IMAGE = "registry.invalid/tinkrl/test-bash:1"

CONTAINERS_CONF = """[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
exit_command_delay = 5
"""
# exit_command_delay: how long podman keeps a finished exec session (and its conmon
# process) for Docker API clients to inspect its exit code. The default, 300 s, piles up
# hundreds of sleeping conmons over a test run; 0 loses the exit code.


def unavailable_reason() -> str | None:
    """Why podman cannot run here (None when it can)."""
    if not shutil.which("podman"):
        return "podman is not installed (scripts/install-system.sh installs it: apt-get install podman runc)"
    if not shutil.which("runc"):
        return "runc is not installed (apt-get install runc)"
    if not os.path.exists(BUSYBOX):
        return f"{BUSYBOX} missing (apt-get install busybox-static)"
    if os.geteuid() != 0:
        return "the podman tests run rootful podman (need root)"
    return None


@dataclass
class Podman:
    root: Path
    env: dict[str, str]
    socket: Path
    service: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"unix://{self.socket}"

    def run(self, *args: str, check: bool = True, input_: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["podman", *args], env=self.env, check=check, capture_output=True, input=input_, timeout=120
        )

    def stop(self) -> None:
        if self.service and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(10)
            except subprocess.TimeoutExpired:
                self.service.kill()
        # remove every container this engine still has (tests clean up; this is the backstop)
        self.run("rm", "-af", "-t", "0", check=False)
        # podman bind-mounts its overlay dir onto itself; undo it so the temp dir can go
        overlay = self.root / "graph" / "overlay"
        if os.path.ismount(overlay):
            subprocess.run(["umount", str(overlay)], check=False, capture_output=True)


def shared_libraries(binary: str) -> list[str]:
    """The host paths of the shared libraries `binary` loads, its loader included (from ldd)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return [word for line in out.splitlines() for word in line.split() if word.startswith("/")]


def busybox_rootfs_tar(dest: Path, with_bash: bool = False) -> Path:
    """A tar of a minimal root filesystem: busybox and its applets, /tmp, /etc/passwd; `with_bash` adds the
    host's /bin/bash and the libraries it loads."""
    tar_path = dest / ("rootfs-bash.tar" if with_bash else "rootfs.tar")
    if tar_path.exists():
        return tar_path
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    with tarfile.open(tar_path, "w") as tf:

        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tf.addfile(info)

        for d in ("bin", "etc", "proc", "sys", "dev", "root", "app", "run"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        tf.add(BUSYBOX, arcname="bin/busybox")
        for a in applets:
            if a in ("busybox",) or "/" in a or (with_bash and a == "bash"):
                continue
            info = tarfile.TarInfo(f"bin/{a}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tf.addfile(info)
        if with_bash:
            for path in ("/bin/bash", *shared_libraries("/bin/bash")):
                tf.add(os.path.realpath(path), arcname=path.lstrip("/"))
        for name, text in (
            ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"),
            ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            import io

            tf.addfile(info, io.BytesIO(data))
    return tar_path


def start(root: Path, with_service: bool = True, with_bash: bool = False) -> Podman:
    """Configure podman under `root`, import the test image (and, `with_bash`, BASH_IMAGE), and serve the
    Docker API."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "containers.conf").write_text(CONTAINERS_CONF)
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n'
    )
    env = {
        **os.environ,
        "CONTAINERS_CONF": str(root / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
        "TMPDIR": str(root),
    }
    pm = Podman(root=root, env=env, socket=root / "podman.sock")
    images = [(TEST_IMAGE, False)] + ([(BASH_IMAGE, True)] if with_bash else [])
    for image, bash in images:
        if pm.run("image", "exists", image, check=False).returncode != 0:
            pm.run(
                "import",
                "--change",
                "CMD=/bin/sh",
                "--change",
                "ENV=PATH=/usr/local/bin:/usr/bin:/bin",
                str(busybox_rootfs_tar(root, bash)),
                image,
            )
    if with_service:
        pm.service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", pm.base_url],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(root / "service.log", "ab"),
        )
        deadline = time.monotonic() + 30
        while not pm.socket.exists():
            if pm.service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman system service did not start: {(root / 'service.log').read_text()[-2000:]}")
            time.sleep(0.05)
    return pm

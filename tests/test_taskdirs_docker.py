"""Image tasks on the docker provider against a real engine (podman's Docker API).

A Harbor task names a prebuilt image AND ships a local workspace: on docker the sandbox
must come from the image (the workspace is not copied over it), grading must restore the
image's own test-steering files and use the image's PATH, and the gate must pass.
Skips only when podman cannot run at all (see podman_helper.unavailable_reason).
"""

from __future__ import annotations

import io
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from helpers import podman_helper
from helpers.requirements import skip_module_unless  # noqa: E402

pytest.importorskip("docker", reason="docker SDK not installed (pip install -e '.[dev]')")
skip_module_unless(podman_helper.unavailable_reason())

from tinkrl.sandbox.docker import DockerProvider  # noqa: E402
from tinkrl.taskdirs import grade, load_task, run_gate, start_sandbox  # noqa: E402

IMAGE = "localhost/tinkrl-test-task:1"
# busybox has no bash; task scripts and the grader call bash with bash-only options
BASH_SHIM = (
    '#!/bin/sh\nwhile [ "$#" -gt 0 ]; do case "$1" in --noprofile|--norc) shift;; *) break;; esac; done\n'
    'exec /bin/sh "$@"\n'
)
IMAGE_FILES = {
    "bin/bash": (BASH_SHIM, 0o755),
    "app/data.txt": ("from image\n", 0o644),
    "app/setup.cfg": ("[orig]\n", 0o644),
    "opt/tool/bin/imagetool": ("#!/bin/sh\necho image-tool\n", 0o755),
    "app/hidden/t.sh": (
        'if [ "$(cat /app/data.txt)" = "from image" ] && [ ! -e /app/new_test.txt ]; '
        "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
        0o644,
    ),
}
TEST_SH = """#!/bin/bash
if [ "$(cat /app/data.txt)" = fixed ] && [ "$(imagetool)" = image-tool ] && [ "$(cat /app/setup.cfg)" = "[orig]" ] \\
   && [ ! -e /app/conftest.py ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    root = tmp_path_factory.mktemp("podman")
    pm = podman_helper.start(root)
    tar = root / "task-image.tar"
    shutil.copy(podman_helper.busybox_rootfs_tar(root), tar)
    with tarfile.open(tar, "a") as tf:
        for d in ("opt", "opt/tool", "opt/tool/bin", "app/hidden"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        for name, (text, mode) in IMAGE_FILES.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text.encode()), mode
            tf.addfile(info, io.BytesIO(text.encode()))
    pm.run("import", "--change", "CMD=/bin/sh", "--change", "ENV=PATH=/opt/tool/bin:/usr/bin:/bin", str(tar), IMAGE)
    yield pm
    pm.stop()


@pytest.fixture(scope="module")
def provider(podman):
    p = DockerProvider(base_url=podman.base_url, run_id="tasksimg", pull="never", reap_on_start=False)
    yield p
    p.close()


@pytest.fixture()
def task_dir(tmp_path):
    d = tmp_path / "image-task"
    (d / "environment" / "workspace").mkdir(parents=True)
    (d / "environment" / "workspace" / "data.txt").write_text("from workspace\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(TEST_SH)
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\necho fixed > /app/data.txt\n")
    (d / "instruction.md").write_text("Write `fixed` into /app/data.txt.\n")
    (d / "task.toml").write_text(
        f'[task]\nname = "image-task"\n[verifier]\ntimeout_sec = 30\n'
        f'[environment]\nworkdir = "/app"\ndocker_image = "{IMAGE}"\n'
    )
    return d


def test_the_sandbox_comes_from_the_task_image_not_the_workspace(provider, task_dir):
    task = load_task(task_dir)
    assert task.image == IMAGE and task.build  # bwrap would build the workspace instead
    with start_sandbox(task, provider) as sb:
        sb.container.reload()
        assert sb.container.attrs["Config"]["Image"].endswith("tinkrl-test-task:1")
        assert sb.read_file("/app/data.txt") == b"from image\n"  # the workspace did not clobber it
        # the agent fixes the file, but also tampers with a test-steering file and plants one
        sb.exec("echo fixed > data.txt && echo '[planted]' > setup.cfg && echo 'x = 1' > conftest.py")
        result = grade(task, sb)
        assert result.reward == 1.0, result.detail + result.output
        assert sb.read_file("/app/setup.cfg") == b"[orig]\n"


def test_the_gate_passes_on_the_image(provider, task_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TINKRL_HOME", str(tmp_path / "home"))
    res = run_gate(load_task(task_dir), provider, use_cache=False)
    assert res.ok and res.solution_reward == 1.0 and res.noop_reward == 0.0, res.detail


def test_restore_paths_and_hidden_tests_come_from_the_image(provider, tmp_path):
    from tinkrl.taskdirs.model import Task

    # as an R2E/SWE-bench row from an image: hidden tests kept in the image are taken out
    # before the agent starts and copied to /tests at grading; restore paths go back to
    # what the image held (removed if it had none)
    task = Task(
        id="img-row",
        source=tmp_path,
        format="r2e",
        instruction="x",
        workdir="/app",
        grader="reward_file",
        image=IMAGE,
        image_tests="/app/hidden",
        restore_paths=["/app/data.txt", "/app/new_test.txt"],
        test_command="bash /tests/hidden/t.sh",
        verifier_timeout_s=30,
    )
    with start_sandbox(task, provider) as sb:
        assert sb.exec("test -e /app/hidden").exit_code == 1  # the agent cannot read them
        sb.exec("echo changed > data.txt && echo planted > new_test.txt")
        result = grade(task, sb)
        assert result.reward == 1.0, result.detail + result.output

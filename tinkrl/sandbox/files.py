"""Moving files between the host and a sandbox, for every provider: path checks and tar streams.

A sandbox's content is untrusted and tinkrl usually runs as root, so whatever comes out of
a sandbox is extracted by `safe_extract`, which writes only regular files and directories
under the destination (no links, devices, absolute paths or `..`).
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path


def tar_host_path(src: Path, arcname: str) -> bytes:
    """A host file or directory as an uncompressed tar stream, its top entry named `arcname`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(str(src), arcname=arcname)
    return buf.getvalue()


def tar_file_bytes(name: str, data: bytes, mode: int) -> bytes:
    """One file, `data` with permission bits `mode` (modified now), as an uncompressed tar stream
    whose only entry is named `name`: what a container engine's put_archive unpacks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        info.mtime = int(time.time())
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def first_file_in_tar(data: bytes, path: str) -> bytes:
    """The bytes of the first regular file in a tar stream (a container engine's get_archive of
    `path`); IsADirectoryError when it holds none."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf.getmembers():
            if m.isfile():
                return tf.extractfile(m).read()
    raise IsADirectoryError(21, "Is a directory", path)


def safe_extract(data: bytes, dest: Path, strip_top: bool = True) -> None:
    """Extract a tar stream from a sandbox onto the host: only regular files and dirs.

    The sandbox's content is untrusted (and we are usually root): no links, devices,
    absolute paths or `..`. A single-file archive lands at `dest`; a directory's contents
    land inside `dest` (its top-level name stripped when `strip_top`).
    """
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        members = tf.getmembers()
        if len(members) == 1 and members[0].isfile() and members[0].name not in (".", ""):
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(tf.extractfile(members[0]).read())
            dest.chmod(members[0].mode & 0o755 | 0o600)
            return
        dest.mkdir(parents=True, exist_ok=True)
        for m in members:
            parts = [x for x in Path(m.name).parts if x not in (".", "")]
            if strip_top and parts:
                parts = parts[1:]
            if m.name.startswith("/") or ".." in parts:
                continue
            target = dest.joinpath(*parts) if parts else dest
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif m.isfile() and parts:
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink():
                    target.unlink()
                target.write_bytes(tf.extractfile(m).read())
                target.chmod(m.mode & 0o755 | 0o600)


def check_abs(path: str) -> str:
    """`path` without trailing slashes; ValueError unless it is absolute (sandbox paths always are)."""
    if not str(path).startswith("/"):
        raise ValueError(f"sandbox paths must be absolute, got {path!r}")
    return str(path).rstrip("/") or "/"

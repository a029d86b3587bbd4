from pathlib import Path


def test_large_files_listed():
    want = ["img/logo.png", "logs/old/app.1", "tmp/big file.bin"]
    assert Path("/app/large.txt").read_text().splitlines() == want

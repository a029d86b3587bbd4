"""Checks /app/report.json against counts computed here from the same log."""

import collections
import json
import re
from pathlib import Path

LINE = re.compile(r'"\S+ (\S+) [^"]*" (\d{3}) ')


def expected():
    reqs = [LINE.search(line).groups() for line in Path("/app/access.log").read_text().splitlines() if line]
    statuses = collections.Counter(code for _, code in reqs)
    paths = collections.Counter(path for path, _ in reqs)
    return len(reqs), dict(statuses), paths.most_common(1)[0][0]


def report():
    return json.loads(Path("/app/report.json").read_text())


def test_total():
    assert report()["total"] == expected()[0]


def test_by_status():
    assert {str(k): v for k, v in report()["by_status"].items()} == expected()[1]


def test_top_path():
    assert report()["top_path"] == expected()[2]

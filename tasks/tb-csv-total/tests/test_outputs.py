import csv
from pathlib import Path


def test_total():
    rows = list(csv.DictReader(open("/app/sales.csv")))
    want = sum(int(r["units"]) * float(r["price"]) for r in rows)
    assert Path("/app/total.txt").read_text().strip() == f"{want:.2f}"

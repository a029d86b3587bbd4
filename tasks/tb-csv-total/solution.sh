#!/bin/bash
python3 - <<'PY' > /app/total.txt
import csv
rows = list(csv.DictReader(open("/app/sales.csv")))
print(f"{sum(int(r['units']) * float(r['price']) for r in rows):.2f}")
PY

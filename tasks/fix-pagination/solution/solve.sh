#!/bin/bash
cd /app
python3 - <<'PY'
from pathlib import Path
p = Path("pager/pages.py")
s = p.read_text()
s = s.replace("return n_items // per_page", "return -(-n_items // per_page)")
s = s.replace("        raise IndexError(page)", "        return []")
p.write_text(s)
PY

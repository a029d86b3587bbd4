#!/bin/bash
python3 - <<'PY'
import collections, json, re
reqs = [re.search(r'"\S+ (\S+) [^"]*" (\d{3}) ', l).groups() for l in open("/app/access.log") if l.strip()]
json.dump({"total": len(reqs),
           "by_status": dict(collections.Counter(c for _, c in reqs)),
           "top_path": collections.Counter(p for p, _ in reqs).most_common(1)[0][0]},
          open("/app/report.json", "w"))
PY

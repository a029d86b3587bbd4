#!/bin/bash
cat > /app/wordfreq <<'PY'
#!/usr/bin/env python3
import collections, re, sys
counts = collections.Counter(w.lower() for w in re.findall(r"[A-Za-z]+", sys.stdin.read()))
for word, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]:
    print(word, n)
PY
chmod +x /app/wordfreq

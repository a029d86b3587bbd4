#!/bin/bash
# Harbor verifier: reward 1 iff the three .tmp files are gone and README, page.tmpl and thumbnails.db are intact.
ok=0
if [ ! -e /app/cache/session_8f3a.tmp ] && [ ! -e /app/cache/upload_0192.tmp ] && [ ! -e /app/cache/render.tmp ] \
  && [ "$(cat /app/cache/page.tmpl 2>/dev/null)" = "<html><body>{{ content }}</body></html>" ] \
  && [ "$(cat /app/cache/thumbnails.db 2>/dev/null)" = "thumbs v1: 218 entries" ] \
  && grep -q regenerated /app/cache/README 2>/dev/null && [ "$(ls -A /app/cache | wc -l)" = 3 ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

#!/bin/bash
# Harbor verifier: reward 1 iff draft.md became notes/final.md with its text, and ideas.md stayed.
ok=0
if [ ! -e /app/notes/draft.md ] && [ "$(head -n 1 /app/notes/final.md 2>/dev/null)" = "# Plan" ] \
  && [ -f /app/notes/ideas.md ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

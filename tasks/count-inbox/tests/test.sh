#!/bin/bash
# Harbor verifier: reward 1 iff /app/inbox_count.txt holds just 5 (surrounding spaces allowed) and the inbox still has its five files.
ok=0
if [ "$(tr -d ' \n' < /app/inbox_count.txt 2>/dev/null)" = 5 ] && [ "$(ls -A /app/inbox | wc -l)" = 5 ] \
  && [ -f /app/inbox/notes.txt ] && [ -f /app/inbox/invoice_1042.pdf ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

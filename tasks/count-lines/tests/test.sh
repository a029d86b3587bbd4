#!/bin/bash
# Harbor verifier: reward 1 iff /app/line_count.txt holds just 7 (surrounding spaces allowed) and users.csv is unchanged.
ok=0
if [ "$(tr -d ' \n' < /app/line_count.txt 2>/dev/null)" = 7 ] \
  && [ "$(wc -l < /app/data/users.csv)" = 7 ] && [ "$(head -n 1 /app/data/users.csv)" = "id,name,email,role" ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

#!/bin/bash
# Harbor verifier: reward 1 iff error_count.txt holds the number 3 (surrounding spaces allowed).
ok=0
[ "$(tr -d ' \n' < /app/error_count.txt 2>/dev/null)" = 3 ] && ok=1
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

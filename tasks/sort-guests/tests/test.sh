#!/bin/bash
# Harbor verifier: reward 1 iff guests_sorted.txt is the six names in A-Z order.
expected=$(printf '%s\n' Adam Ben Liam Maya Olivia Zoe)
ok=0
[ "$(cat /app/guests_sorted.txt 2>/dev/null)" = "$expected" ] && ok=1
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

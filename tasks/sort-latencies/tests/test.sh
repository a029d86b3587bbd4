#!/bin/bash
# Harbor verifier: reward 1 iff results/sorted.txt holds the eight numbers in ascending numeric order and latency.txt is unchanged.
expected=$(printf '%s\n' 8 9 17 45 63 120 300 1024)
ok=0
if [ -f /app/results/sorted.txt ] && [ "$(cat /app/results/sorted.txt)" = "$expected" ] \
  && [ "$(tr '\n' ' ' < /app/results/latency.txt)" = "120 8 45 300 17 9 1024 63 " ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

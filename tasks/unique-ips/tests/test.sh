#!/bin/bash
# Harbor verifier: reward 1 iff unique_ips.txt is the four distinct addresses in sorted order and blocked_ips.txt is unchanged.
ok=0
expected=$(printf '%s\n' 10.20.30.40 192.0.2.15 198.51.100.7 203.0.113.42)
if [ -f /app/unique_ips.txt ] && [ "$(cat /app/unique_ips.txt)" = "$expected" ] \
  && [ "$(wc -l < /app/logs/blocked_ips.txt)" = 8 ] && [ "$(head -n 1 /app/logs/blocked_ips.txt)" = 203.0.113.42 ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

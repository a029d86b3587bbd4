#!/bin/bash
# Harbor verifier: reward 1 iff recent.log is exactly the error log's last five lines and error.log is unchanged.
ok=0
if [ "$(cksum < /app/logs/error.log 2>/dev/null)" = "2387839913 930" ] && [ -f /app/recent.log ] \
  && [ "$(cat /app/recent.log)" = "$(tail -n 5 /app/logs/error.log)" ] && [ "$(wc -l < /app/recent.log)" = 5 ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

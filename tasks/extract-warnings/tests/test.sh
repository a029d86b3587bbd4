#!/bin/bash
# Harbor verifier: reward 1 iff warnings.log is exactly the three WARN lines, in order, and worker.log still has its nine lines.
ok=0
expected=$(printf '%s\n' "2024-06-11 08:03:41 WARN job 5521 took 12.4s (limit 10s)" \
  "2024-06-11 08:07:31 WARN retrying job 5523 (attempt 2 of 3)" "2024-06-11 08:15:55 WARN memory usage at 87%")
if [ -f /app/warnings.log ] && [ "$(cat /app/warnings.log)" = "$expected" ] \
  && [ "$(wc -l < /app/logs/worker.log)" = 9 ] && [ "$(grep -c WARN /app/logs/worker.log)" = 3 ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

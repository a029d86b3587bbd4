#!/bin/bash
# Harbor verifier: reward 1 iff /app/old_reports is gone and /app/reports still holds both files.
ok=0
if [ ! -e /app/old_reports ] && [ "$(cat /app/reports/q1.txt 2>/dev/null)" = "revenue 120" ] \
  && [ "$(cat /app/reports/q2.txt 2>/dev/null)" = "revenue 135" ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

#!/bin/bash
# Harbor verifier: reward 1 iff /app/header.txt holds the CSV's first line and the CSV is unchanged.
ok=0
if [ "$(cat /app/header.txt 2>/dev/null)" = "date,station,temp_c" ] \
  && [ "$(wc -l < /app/data/measurements.csv)" = 4 ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

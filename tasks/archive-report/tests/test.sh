#!/bin/bash
# Harbor verifier: reward 1 iff report_2023.txt now lives in /app/archive (same text) and report_2024.txt stayed.
ok=0
if [ -d /app/archive ] && [ ! -e /app/report_2023.txt ] \
  && [ "$(head -n 1 /app/archive/report_2023.txt 2>/dev/null)" = "Annual report 2023" ] \
  && [ -f /app/report_2024.txt ] && [ ! -e /app/archive/report_2024.txt ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

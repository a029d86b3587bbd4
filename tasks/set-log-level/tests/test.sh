#!/bin/bash
# Harbor verifier: reward 1 iff service.env says LOG_LEVEL=info and every other line is as it was.
expected=$(printf '%s\n' APP_NAME=payments-api PORT=8000 WORKERS=4 LOG_LEVEL=info \
  LOG_FILE=/var/log/payments/debug.log DATABASE_URL=postgres://payments@10.0.3.5:5432/payments)
ok=0
[ -f /app/service.env ] && [ "$(cat /app/service.env)" = "$expected" ] && ok=1
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

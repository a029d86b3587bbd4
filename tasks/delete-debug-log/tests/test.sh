#!/bin/bash
# Harbor verifier: reward 1 iff debug.log is gone and app.log and error.log are untouched.
ok=0
if [ ! -e /app/logs/debug.log ] && [ "$(cat /app/logs/app.log 2>/dev/null)" = "$(printf 'started\nready')" ] \
  && [ "$(cat /app/logs/error.log 2>/dev/null)" = "none" ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

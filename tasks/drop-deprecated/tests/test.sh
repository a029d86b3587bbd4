#!/bin/bash
# Harbor verifier: reward 1 iff backend/requirements.clean.txt is the four kept lines in order and requirements.txt is unchanged.
ok=0
expected=$(printf '%s\n' requests==2.31.0 flask==3.0.2 gunicorn==21.2.0 pyyaml==6.0.1)
if [ -f /app/backend/requirements.clean.txt ] && [ "$(cat /app/backend/requirements.clean.txt)" = "$expected" ] \
  && [ "$(wc -l < /app/backend/requirements.txt)" = 6 ] && [ "$(grep -c deprecated /app/backend/requirements.txt)" = 2 ] \
  && [ ! -e /app/requirements.clean.txt ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

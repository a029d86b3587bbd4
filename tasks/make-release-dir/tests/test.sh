#!/bin/bash
# Harbor verifier: reward 1 iff /app/releases/v2.4.0 holds just an empty assets directory and v2.3.0 is untouched.
ok=0
if [ -d /app/releases/v2.4.0/assets ] && [ -z "$(ls -A /app/releases/v2.4.0/assets)" ] \
  && [ "$(ls -A /app/releases/v2.4.0)" = assets ] && [ "$(ls -A /app/releases | tr '\n' ' ')" = "v2.3.0 v2.4.0 " ] \
  && [ "$(head -n 1 /app/releases/v2.3.0/CHANGELOG.md 2>/dev/null)" = "# v2.3.0" ] && [ ! -e /app/assets ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

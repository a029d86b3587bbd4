#!/bin/bash
# Harbor verifier: reward 1 iff config.ini.bak is a byte-for-byte copy and config.ini is unchanged.
ok=0
if [ -f /app/config.ini.bak ] && cmp -s /app/config.ini /app/config.ini.bak \
  && grep -qx 'port = 8080' /app/config.ini && [ "$(wc -l < /app/config.ini)" = 6 ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

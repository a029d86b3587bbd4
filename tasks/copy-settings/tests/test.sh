#!/bin/bash
# Harbor verifier: reward 1 iff deploy/settings.yaml is a byte-for-byte copy, the original stayed, and docker-compose.yml is untouched.
ok=0
if [ -f /app/settings.yaml ] && [ -f /app/deploy/settings.yaml ] && cmp -s /app/settings.yaml /app/deploy/settings.yaml \
  && grep -qx '  name: inventory-service' /app/settings.yaml && [ "$(wc -l < /app/settings.yaml)" = 7 ] \
  && [ "$(ls -A /app/deploy | wc -l)" = 2 ] && grep -q 'inventory-service:3.1.4' /app/deploy/docker-compose.yml \
  && [ "$(wc -l < /app/deploy/docker-compose.yml)" = 5 ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

#!/bin/bash
# Harbor verifier: reward 1 iff /app/hosts.txt is its three old lines followed by the new one.
expected=$(printf '%s\n' "127.0.0.1 localhost" "192.168.1.1 router.lan" "192.168.1.20 nas.lan" "192.168.1.50 printer.lan")
ok=0
[ -f /app/hosts.txt ] && [ "$(cat /app/hosts.txt)" = "$expected" ] && ok=1
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

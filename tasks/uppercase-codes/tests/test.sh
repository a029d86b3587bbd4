#!/bin/bash
# Harbor verifier: reward 1 iff airports_upper.txt is airports.txt in capitals and airports.txt is still lower case.
ok=0
expected=$(printf '%s\n' "LHR LONDON HEATHROW" "CDG PARIS CHARLES DE GAULLE" "JFK NEW YORK KENNEDY" \
  "NRT TOKYO NARITA" "GRU SAO PAULO GUARULHOS")
if [ -f /app/airports_upper.txt ] && [ "$(cat /app/airports_upper.txt)" = "$expected" ] \
  && [ "$(head -n 1 /app/airports.txt 2>/dev/null)" = "lhr london heathrow" ] && [ "$(wc -l < /app/airports.txt)" = 5 ]; then ok=1; fi
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

#!/bin/bash
# Harbor verifier: reward 1 iff both colours became color and nothing else changed.
expected=$(printf '%s\n' "The color of the sky." "Pick a color scheme." "No change here.")
ok=0
[ "$(cat /app/notes.txt 2>/dev/null)" = "$expected" ] && ok=1
if [ "$ok" = 1 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi

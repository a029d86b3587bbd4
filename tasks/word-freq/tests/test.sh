#!/bin/bash
# reward.txt = fraction of hidden inputs answered exactly.
n=0; ok=0
for input in /tests/data/*.txt; do
  n=$((n+1))
  got=$(timeout 10 /app/wordfreq < "$input" 2>/dev/null)
  [ "$got" = "$(cat "${input%.txt}.expected")" ] && ok=$((ok+1))
done
python3 -c "print($ok / $n)" > /logs/verifier/reward.txt

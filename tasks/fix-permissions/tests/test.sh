#!/bin/bash
# reward.json: executable bit, untouched script, expected output; "reward" is 1 only if all hold.
cd /app
exe=0; [ -x process_data.sh ] && exe=1
same=0; sha256sum -c --status .script.sha256 2>/dev/null && same=1
out=0; [ "$(cat output.txt 2>/dev/null)" = "processed: 3 lines" ] && out=1
reward=0; [ $exe$same$out = 111 ] && reward=1
printf '{"reward": %s, "executable": %s, "unchanged": %s, "output": %s}\n' $reward $exe $same $out > /logs/verifier/reward.json

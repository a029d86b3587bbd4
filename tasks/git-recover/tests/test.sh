#!/bin/bash
# reward.txt: 1 iff feature/notes points at a commit "Add release notes" that adds notes.md
# on top of main's history, and main still points at "Add stock".
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
ok=1
msg=$(git log -1 --format=%s feature/notes 2>/dev/null) || ok=0
[ "$msg" = "Add release notes" ] || ok=0
git cat-file -e feature/notes:notes.md 2>/dev/null || ok=0
[ "$(git log -1 --format=%s main 2>/dev/null)" = "Add stock" ] || ok=0
[ "$(git rev-parse feature/notes~1 2>/dev/null)" = "$(git rev-parse main 2>/dev/null)" ] || ok=0
echo $ok > /logs/verifier/reward.txt

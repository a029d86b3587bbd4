#!/bin/bash
# Build the history: main with two commits, a feature branch with one more, then delete it.
set -e
export GIT_AUTHOR_NAME=dev GIT_AUTHOR_EMAIL=dev@example.com GIT_COMMITTER_NAME=dev GIT_COMMITTER_EMAIL=dev@example.com
git init -q -b main .
git add README.md && git commit -qm "Initial commit"
echo "apples: 3" > stock.txt && git add stock.txt && git commit -qm "Add stock"
git checkout -qb feature/notes
printf '# Release notes\n\n- stock tracking\n' > notes.md && git add notes.md && git commit -qm "Add release notes"
git checkout -q main
git branch -qD feature/notes

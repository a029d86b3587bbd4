#!/bin/bash
set -e
git init -q -b main . && git add -A
git -c user.name=dev -c user.email=dev@example.com commit -qm "pager"

#!/bin/bash
# Hidden tests against the repository; reward 1 iff they all pass.
cd /app
cp /tests/test_pages.py tests/test_hidden_pages.py
if python3 -m pytest -p no:cacheprovider -q tests; then r=1; else r=0; fi
rm -f tests/test_hidden_pages.py
echo $r > /logs/verifier/reward.txt

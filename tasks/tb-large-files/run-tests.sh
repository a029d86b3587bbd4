#!/bin/bash
# Offline version of the terminal-bench template: the sandbox already has pytest.
if [ "$PWD" = "/" ]; then echo "Error: no working directory set"; exit 1; fi
python3 -m pytest -p no:cacheprovider $TEST_DIR/test_outputs.py -rA

#!/bin/bash
cd /app
python3 -m pytest -p no:cacheprovider -rA /tests/test_outputs.py

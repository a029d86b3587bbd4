#!/bin/bash
# Harbor verifier: reward 1 iff /app/hello.txt holds exactly "Hello, world!".
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "Hello, world!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

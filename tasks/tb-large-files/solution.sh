#!/bin/bash
cd /app/data && find . -type f -size +1024c -printf '%P\n' | LC_ALL=C sort > /app/large.txt

#!/bin/bash
grep -c ERROR /app/server.log > /app/error_count.txt

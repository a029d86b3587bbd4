#!/bin/bash
wc -l < /app/data/users.csv > /app/line_count.txt

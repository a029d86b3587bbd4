#!/bin/bash
sort -u /app/logs/blocked_ips.txt > /app/unique_ips.txt

#!/bin/bash
sort -n /app/results/latency.txt > /app/results/sorted.txt

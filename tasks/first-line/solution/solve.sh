#!/bin/bash
cd /app
head -n 1 data/measurements.csv > header.txt

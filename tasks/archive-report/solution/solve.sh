#!/bin/bash
cd /app
mkdir -p archive
mv report_2023.txt archive/

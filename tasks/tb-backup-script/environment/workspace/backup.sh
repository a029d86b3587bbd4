#!/bin/bash
# Copy /app/etc/*.conf into /app/backups/<name> and print how many were copied.
name=$1
mkdir -p /app/backups/$name
count=0
for f in /app/etc/*.conf; do
  cp $f /app/backups/$name/
  count=$((count+1))
done
echo $count

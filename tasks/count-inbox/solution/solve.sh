#!/bin/bash
ls /app/inbox | wc -l > /app/inbox_count.txt

#!/bin/bash
tail -n 5 /app/logs/error.log > /app/recent.log

#!/bin/bash
grep WARN /app/logs/worker.log > /app/warnings.log

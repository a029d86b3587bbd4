#!/bin/bash
cd /app/backend && grep -v deprecated requirements.txt > requirements.clean.txt

#!/bin/bash
chmod +x /app/backup.sh

#!/bin/bash
rm /app/logs/debug.log

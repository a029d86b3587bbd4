#!/bin/bash
mkdir -p /app/releases/v2.4.0/assets

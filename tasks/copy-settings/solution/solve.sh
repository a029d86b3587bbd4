#!/bin/bash
cp /app/settings.yaml /app/deploy/

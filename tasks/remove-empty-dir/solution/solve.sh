#!/bin/bash
rmdir /app/old_reports

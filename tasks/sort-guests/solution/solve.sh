#!/bin/bash
sort /app/guests.txt > /app/guests_sorted.txt

#!/bin/bash
tr a-z A-Z < /app/airports.txt > /app/airports_upper.txt

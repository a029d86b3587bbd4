#!/bin/bash
# Count the lines of data.txt and record them with the label from the image's ENV.
cd "$(dirname "$0")"
echo "${DATA_LABEL:-unlabelled}: $(wc -l < data.txt) lines" > output.txt

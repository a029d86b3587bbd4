#!/bin/bash
chmod u+x /app/process_data.sh
/app/process_data.sh

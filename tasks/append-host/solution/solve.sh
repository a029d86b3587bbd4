#!/bin/bash
echo '192.168.1.50 printer.lan' >> /app/hosts.txt

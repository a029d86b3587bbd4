#!/bin/bash
sed -i 's/^LOG_LEVEL=debug$/LOG_LEVEL=info/' /app/service.env

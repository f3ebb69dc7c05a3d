#!/bin/bash
set -e
cd "${APP_DIR:-/app}"
cat > app.ini <<'INI'
[server]
host = 0.0.0.0
port = 8080
debug = false
workers = 4

[database]
url = sqlite:///app.db
pool_size = 5

[cache]
ttl_seconds = 300
INI

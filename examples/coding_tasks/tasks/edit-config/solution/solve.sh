#!/bin/bash
set -e
cd "${APP_DIR:-/app}"
sed -i 's/"port": 3000/"port": 8080/; s/"debug": true/"debug": false/' config.json

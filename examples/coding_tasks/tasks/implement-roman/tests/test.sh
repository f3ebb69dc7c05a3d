#!/bin/bash
# Harbor's contract: run in the workspace, write the reward to /logs/verifier/reward.txt
# (the sandbox's own paths where it says so: $APP_DIR, $TESTS_DIR, $LOGS_DIR).
cd "${APP_DIR:-/app}"
if python3 "${TESTS_DIR:-/tests}/test_roman.py"; then reward=1; else reward=0; fi
echo $reward > "${LOGS_DIR:-/logs}/verifier/reward.txt"

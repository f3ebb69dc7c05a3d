#!/bin/bash
set -e
mkdir -p logs
for i in 1 2 3; do
  for j in $(seq 1 $((i * 4))); do
    if [ $((j % 3)) -eq 0 ]; then echo "ERROR request $i.$j failed"; else echo "INFO request $i.$j ok"; fi
  done > logs/service$i.log
done

#!/bin/bash
set -e
mkdir -p data/raw/2024 data/processed data/tmp
head -c 1200 /dev/zero > data/raw/a.bin
head -c 5000 /dev/zero > data/raw/2024/march.bin
head -c 4999 /dev/zero > data/processed/summary.bin
head -c 300 /dev/zero > data/tmp/scratch.bin
head -c 4000 /dev/zero > data/top.bin

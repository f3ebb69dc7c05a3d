#!/bin/bash
set -e
mkdir -p notes
for name in monday tuesday "team meeting"; do echo "notes of $name" > "notes/$name.txt"; done
echo keep > notes/todo.org

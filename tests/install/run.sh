#!/usr/bin/env bash
# Installs the build tree to a prefix and builds a separate consumer project
# against it with find_package(orpheus).
#   run.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$(mktemp -d /tmp/orpheus-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/lib/cmake/orpheus/orpheus-config.cmake"
test -f "$work/prefix/share/orpheus/schema/mysql/001_create_records.sql"
cmake -S "$src/tests/install/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" -j 2 >/dev/null
"$work/consumer/consumer" "$work/consumer.db"

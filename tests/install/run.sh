#!/usr/bin/env bash
# Installs the build tree to a prefix and builds separate projects against it
# with find_package(orpheus COMPONENTS ...).
#   run.sh SOURCE_DIR BUILD_DIR COMPONENTS
# COMPONENTS: the components the build made, comma-separated (core,sqlite,...).
set -euo pipefail
src=$1 build=$2 built=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/orpheus-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/lib/cmake/orpheus/orpheus-config.cmake"
test -f "$prefix/share/orpheus/schema/mysql/001_create_records.sql"
with_mysql=OFF
case ",$built," in *",mysql,"*) with_mysql=ON ;; esac
with_grpc=OFF
case ",$built," in *",grpc,"*) with_grpc=ON ;; esac
if [ $with_mysql = OFF ]; then
  # No header without its library.
  test ! -e "$prefix/include/orpheus/store/mysql.hpp"
  test ! -e "$prefix/lib/cmake/orpheus/orpheus-mysql-targets.cmake"
fi

# Every component built, linked and run, in a project that sets no C++
# standard (orpheus::core brings C++20).
cmake -S "$src/tests/install/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCONSUMER_WITH_MYSQL=$with_mysql -DCONSUMER_WITH_GRPC=$with_grpc >/dev/null
cmake --build "$work/consumer" -j 2 >/dev/null
"$work/consumer/consumer" "$work/consumer.db"

# find_package(orpheus COMPONENTS $1) succeeds, has the targets $1 and $2,
# and none of the targets $3.
components() {
  cmake -S "$src/tests/install/components" -B "$work/components" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCOMPONENTS="$1" -DPRESENT="$2" -DABSENT="$3" >"$work/components.log" 2>&1 || {
    cat "$work/components.log" >&2
    echo "install test: find_package(orpheus COMPONENTS $1) failed" >&2
    return 1
  }
  rm -rf "$work/components"
}
# find_package(orpheus COMPONENTS $1) fails, saying $2.
refused() {
  if cmake -S "$src/tests/install/components" -B "$work/components" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCOMPONENTS="$1" >"$work/components.log" 2>&1; then
    echo "install test: find_package(orpheus COMPONENTS $1) succeeded" >&2
    return 1
  fi
  # (CMake wraps the message: compare with the lines joined)
  tr -s ' \n' '  ' <"$work/components.log" | grep -qF -- "$2" || {
    cat "$work/components.log" >&2
    echo "install test: find_package(orpheus COMPONENTS $1) failed without saying: $2" >&2
    return 1
  }
  rm -rf "$work/components"
}
# Only what the components asked for need: the SQLite backend alone brings
# neither Boost nor MySQL; the client brings the Beast adapter (and Boost).
components "sqlite" "orpheus::core;SQLite::SQLite3" \
  "orpheus::beast;orpheus::client;orpheus::mysql;Boost::headers;MySQLCppConn::MySQLCppConn"
components "core;payment" "" "orpheus::sqlite;SQLite::SQLite3;orpheus::beast;Boost::headers"
components "client" "orpheus::beast;Boost::headers" "orpheus::sqlite;orpheus::mysql;orpheus::payment"
if [ $with_mysql = ON ]; then
  components "mysql" "MySQLCppConn::MySQLCppConn" "orpheus::sqlite;orpheus::beast;Boost::headers"
else
  refused "sqlite;mysql" "built without MySQL (-DORPHEUS_WITH_MYSQL=OFF)"
fi
case ",$built," in
*",prometheus,"*)
  components "prometheus" "orpheus::core;prometheus-cpp::core" \
    "orpheus::sqlite;orpheus::beast;Boost::headers;orpheus::mysql" ;;
*) refused "prometheus" "built without it (-DORPHEUS_WITH_PROMETHEUS=OFF)" ;;
esac
case ",$built," in
*",grpc,"*)
  components "grpc" "orpheus::core;gRPC::grpc++;protobuf::libprotobuf" \
    "orpheus::sqlite;orpheus::beast;Boost::headers;orpheus::mysql;prometheus-cpp::core" ;;
*) refused "grpc" "built without it (-DORPHEUS_WITH_GRPC=OFF, the default)" ;;
esac
refused "sqlite;nosuch" "'nosuch' is not a component"

# Shared by the scripts that build or install (scripts/test, demo, fuzz, lint,
# bench, bench-http, bench-node, chaos). Sourced, not run.
# shellcheck shell=bash

ORPHEUS_PACKAGES=(build-essential cmake pkg-config libboost-dev libmysqlcppconn-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libsqlite3-dev libssl-dev
  prometheus-cpp-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  mariadb-server mariadb-client galera-4 rsync ninja-build
  locales)  # the unit tests build a decimal-comma locale with localedef
# scripts/test's lint step (Debian 12: version 14 of both).
# shellcheck disable=SC2034  # used by scripts/test and scripts/lint
ORPHEUS_LINT_PACKAGES=(clang-format clang-tidy)
# scripts/fuzz's (libFuzzer comes with clang).
# shellcheck disable=SC2034  # used by scripts/test and scripts/fuzz
ORPHEUS_FUZZ_PACKAGES=(clang-14 libfuzzer-14-dev)

# Installs the Debian packages the project needs (or those named), if any is
# missing.
install_packages() {
  local wanted=("$@") missing=()
  [ ${#wanted[@]} -gt 0 ] || wanted=("${ORPHEUS_PACKAGES[@]}")
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages and not root: apt-get install ${missing[*]}" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  # No service started by a package (mariadb-server's own, on port 3306, on a
  # host that runs systemd): the scripts start the servers they need and stop
  # them. policy-rc.d says so to invoke-rc.d and deb-systemd-invoke for the
  # install, unless the host has a policy of its own.
  # In a subshell whose traps remove it again, on Ctrl-C too (found in
  # review: left behind, it would keep the host's services from starting).
  (
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
      trap 'rm -f "$policy"' EXIT
      # Removed, then the signal passed on as it came (the caller sees it).
      trap 'rm -f "$policy"; trap - INT EXIT; kill -INT $BASHPID' INT
      trap 'rm -f "$policy"; trap - TERM EXIT; kill -TERM $BASHPID' TERM
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
    fi
    apt-get update -qq &&
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  )
}

# The benchmarks' MariaDB settings (scripts/mariadb's ORPHEUS_MARIADB_CNF),
# unless the caller set ORPHEUS_MARIADB_CNF itself (empty: the test servers'
# settings). The test servers keep a 32 MB redo log to spare disk; with it,
# InnoDB's checkpoints stall commits under sustained new keys (p99 80 ms
# against 28 ms with 512 MB: docs/performance.md, eleventh round), which
# would measure the test set-up rather than the library. Durability is the
# same: flush at every commit, doublewrite on.
bench_mariadb_cnf() {
  export ORPHEUS_MARIADB_CNF="${ORPHEUS_MARIADB_CNF-innodb_log_file_size=512M}"
}

# A free TCP port on loopback at or above $1.
free_port() {
  local port=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  echo "$port"
}

# cmake configure of the build tree $1 with extra cmake args. A new tree is
# made with Ninja: on two cores it keeps both busy where Make's per-target
# order leaves one idle while a library links (the ASan+UBSan build of
# scripts/test: 568 s with Make, 399 s with Ninja, same sources, measured
# 2026-11-28). A tree made before keeps its own generator (cmake refuses to
# change it); remove the tree to have Ninja.
configure_tree() {
  local dir=$1 generator=()
  shift
  [ -f "$dir/CMakeCache.txt" ] || generator=(-G Ninja)
  cmake -S "$ROOT" -B "$dir" "${generator[@]}" "$@" >/dev/null
}

# cmake --build of the tree $1 with extra args, without its progress lines;
# a compiler's errors and warnings still show. Ninja prints them on its
# standard output, among its progress, so that cannot be thrown away as it
# can with Make (whose compilers write to standard error).
build_quietly() {
  local dir=$1
  shift
  if [ -f "$dir/build.ninja" ]; then
    cmake --build "$dir" "$@" -- --quiet
  else
    cmake --build "$dir" "$@" >/dev/null
  fi
}

# cmake configure + build into $1 with extra cmake args.
build_tree() {
  local dir=$1
  shift
  configure_tree "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
  cmake --build "$dir" -j "$(nproc)"
}

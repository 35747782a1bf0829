#!/bin/sh
# Benchmark of the /diverge grammar (bench/commands_bench.c): the median
# and p99 time to parse a realistic 64 KB comment over 1,000 runs, against
# a 1 ms target.
#
# usage: bench/commands.sh [runs]
#
# It runs two builds: the one `make bench/commands_bench` gives with the
# tree's configured CFLAGS (with --enable-debug that is -O0), and an -O2
# build of the same sources in a temporary directory, which is what a
# release build of the daemon runs. Exits non-zero when a median misses
# the target.
set -eu

top=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-1000}
cd "$top"

if [ ! -f Makefile ]; then
	echo "commands.sh: run ./configure first" >&2
	exit 2
fi
make -s bench/commands_bench
echo "== configured build ($(sed -n 's/^CFLAGS = //p' Makefile))"
rc=0
./bench/commands_bench "$runs" || rc=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
cc=${CC:-cc}
# stdlib.h comes before banned.h: at -O2 glibc defines atoi() inline.
# shellcheck disable=SC2046
$cc -O2 -DNDEBUG -DHAVE_CONFIG_H -I. -Isrc -include stdlib.h \
	-include src/util/banned.h $(pkg-config --cflags libpcre2-8) -pthread \
	bench/commands_bench.c src/scm/commands.c src/util/xalloc.c \
	src/util/buf.c -o "$tmp/commands_bench" \
	$(pkg-config --libs libpcre2-8 jansson)
echo "== -O2 build ($cc)"
"$tmp/commands_bench" "$runs" || rc=1
exit $rc

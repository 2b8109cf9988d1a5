#!/usr/bin/env bash
# Installs the real servers the tests start (internal/testenv), as root on
# Debian. Idempotent: a second run installs nothing and takes well under a
# second.
#
#   redis-server     apt, if missing (speaks Valkey's protocol)
#   rabbitmq-server  apt, if missing; the system service is NOT started or
#                    left enabled: every test starts its own broker on
#                    loopback (testenv.StartRabbitMQ)
#   nodejs, npm      apt, if npm is missing (to install pouchdb-server)
#   pouchdb-server   npm, version 4.2.0, if missing, into
#                    $STARLEASE_CACHE_DIR/pouchdb-server-4.2.0 (default
#                    /var/cache/starlease), outside the repository so reruns
#                    are fast
#   python3, python3-pytest, python3-pika, nim
#                    apt, if missing: the Python and Nim client suites
#   chromium         apt, if missing: the console's browser tests drive
#                    it headless (testenv.FindChromium runs
#                    /usr/lib/chromium/chromium, or $STARLEASE_CHROMIUM)
#   @redocly/cli     npm, version 2.77.0, if missing, into
#                    $STARLEASE_CACHE_DIR/redocly-cli-2.77.0: the OpenAPI
#                    linter httpapi's TestOpenAPILint runs
#
# Status lines go to stderr; stdout is one line, the path of the
# pouchdb-server executable (testenv finds it at that path by itself, or
# wherever $STARLEASE_POUCHDB_SERVER points). With --print redocly it is
# the path of the redocly executable instead (the test finds it at that
# path by itself, or wherever $STARLEASE_REDOCLY points).
set -euo pipefail

print=pouchdb-server
case "${1:-}" in
"") ;;
--print)
	print=${2:-}
	[[ $print == pouchdb-server || $print == redocly ]] || {
		echo "usage: $0 [--print pouchdb-server|redocly]" >&2
		exit 2
	}
	;;
*)
	echo "usage: $0 [--print pouchdb-server|redocly]" >&2
	exit 2
	;;
esac

POUCHDB_VERSION=4.2.0
CACHE_DIR=${STARLEASE_CACHE_DIR:-/var/cache/starlease}
POUCHDB_DIR=$CACHE_DIR/pouchdb-server-$POUCHDB_VERSION
POUCHDB_BIN=$POUCHDB_DIR/node_modules/.bin/pouchdb-server
REDOCLY_VERSION=2.77.0
REDOCLY_DIR=$CACHE_DIR/redocly-cli-$REDOCLY_VERSION
REDOCLY_BIN=$REDOCLY_DIR/node_modules/.bin/redocly
RABBITMQ_BIN=/usr/lib/rabbitmq/bin/rabbitmq-server

say() { printf 'install-servers: %s\n' "$*" >&2; }

export DEBIAN_FRONTEND=noninteractive

# --- apt packages --------------------------------------------------------
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
[[ -x $RABBITMQ_BIN && -x /usr/bin/epmd ]] || missing+=(rabbitmq-server)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
# The client suites (package clients): Debian's python3 with pytest and
# pika, and the Nim compiler.
[[ -x /usr/bin/python3 ]] || missing+=(python3)
/usr/bin/python3 -c 'import pytest' >/dev/null 2>&1 || missing+=(python3-pytest)
/usr/bin/python3 -c 'import pika' >/dev/null 2>&1 || missing+=(python3-pika)
command -v nim >/dev/null 2>&1 || missing+=(nim)
# The console's browser tests (package console).
[[ -x /usr/lib/chromium/chromium ]] || missing+=(chromium)

# Leaves the rabbitmq-server system service stopped and disabled: the
# package enables it (systemd unit and SysV links) and its postinst starts
# it unless policy-rc.d forbids that. A system broker would listen on
# 0.0.0.0:5672 and 25672 with epmd on 0.0.0.0:4369.
disable_rabbitmq_service() {
	if command -v systemctl >/dev/null 2>&1; then
		if [[ -d /run/systemd/system ]]; then
			systemctl disable --now rabbitmq-server.service >/dev/null 2>&1 || true
		else
			# systemd not running (a container): only remove the links.
			systemctl disable rabbitmq-server.service >/dev/null 2>&1 || true
		fi
	fi
	if command -v update-rc.d >/dev/null 2>&1 && [[ -e /etc/init.d/rabbitmq-server ]]; then
		update-rc.d rabbitmq-server disable >/dev/null 2>&1 || true
	fi
	# A broker the postinst started anyway runs as user rabbitmq; so does
	# the epmd it spawned. Stop the service, then end those by pid.
	local pids
	pids=$(pgrep -u rabbitmq 2>/dev/null || true)
	if [[ -n $pids ]]; then
		say "the package started a system rabbitmq-server (pids: $(echo $pids)); stopping it"
		service rabbitmq-server stop >/dev/null 2>&1 || true
		pids=$(pgrep -u rabbitmq 2>/dev/null || true)
		for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
		sleep 1
		pids=$(pgrep -u rabbitmq 2>/dev/null || true)
		for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
	fi
}

if ((${#missing[@]} > 0)); then
	say "installing with apt: ${missing[*]}"
	# Forbid service starts during the install (the standard Debian hook),
	# unless the machine already has its own policy.
	own_policy=
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 755 /usr/sbin/policy-rc.d
		own_policy=1
		trap 'rm -f /usr/sbin/policy-rc.d' EXIT
	fi
	# apt and debconf are chatty on stderr ("delaying package
	# configuration", ...): their output goes to a log, shown on failure.
	aptlog=$(mktemp)
	if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$aptlog" 2>&1; then
		cat "$aptlog" >&2
		rm -f "$aptlog"
		exit 1
	fi
	rm -f "$aptlog"
	if [[ -n $own_policy ]]; then
		rm -f /usr/sbin/policy-rc.d
		trap - EXIT
	fi
	if [[ " ${missing[*]} " == *" rabbitmq-server "* ]]; then
		disable_rabbitmq_service
		say "rabbitmq-server system service disabled (tests start their own brokers)"
	fi
fi

# --- npm packages ----------------------------------------------------------
# installed_version DIR PACKAGE BIN: the version of PACKAGE installed in
# DIR, if its executable BIN is there too.
installed_version() {
	local pkg=$1/node_modules/$2/package.json
	[[ -x $3 && -f $pkg ]] || return 0
	node -e 'process.stdout.write(require(process.argv[1]).version)' "$pkg" 2>/dev/null || true
}

# npm_install NAME PACKAGE VERSION DIR BIN HOW-LONG installs PACKAGE@VERSION
# into DIR unless it is there. --ignore-scripts: pouchdb-server's install
# scripts only build sqlite3, which the in-memory server does not use
# (leveldown ships its binary); redocly needs none.
npm_install() {
	local name=$1 pkg=$2 version=$3 dir=$4 bin=$5 how_long=$6
	[[ $(installed_version "$dir" "$pkg" "$bin") == "$version" ]] && return 0
	say "installing $pkg@$version into $dir (npm, $how_long)"
	mkdir -p "$CACHE_DIR"
	# Install next to the target and move it into place, so an interrupted
	# install never looks complete.
	tmp=$(mktemp -d "$CACHE_DIR/.$name-$version.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	printf '{"name":"starlease-%s","private":true}\n' "$name" >"$tmp/package.json"
	(cd "$tmp" && npm install --ignore-scripts --no-audit --no-fund --loglevel=error \
		"$pkg@$version" >/dev/null)
	rm -rf "$dir"
	chmod 755 "$tmp"
	mv "$tmp" "$dir"
	trap - EXIT
	if [[ $(installed_version "$dir" "$pkg" "$bin") != "$version" ]]; then
		say "$pkg@$version did not install into $dir"
		exit 1
	fi
}

npm_install pouchdb-server pouchdb-server "$POUCHDB_VERSION" "$POUCHDB_DIR" "$POUCHDB_BIN" "about 15-40 s"
npm_install redocly-cli @redocly/cli "$REDOCLY_VERSION" "$REDOCLY_DIR" "$REDOCLY_BIN" "about 20-60 s"

# Warn (only) about a system broker that tests could be confused with.
if pgrep -u rabbitmq >/dev/null 2>&1; then
	say "warning: a system rabbitmq-server is running (user rabbitmq); tests do not use it"
fi

say "ok: redis-server $(command -v redis-server), rabbitmq-server $RABBITMQ_BIN, chromium /usr/lib/chromium/chromium, pouchdb-server $POUCHDB_VERSION, redocly $REDOCLY_VERSION"
if [[ $print == redocly ]]; then
	echo "$REDOCLY_BIN"
else
	echo "$POUCHDB_BIN"
fi

#!/usr/bin/env bash
# Quick start: build starlease and serve the lease HTTP API on the embedded
# default backend (bolt) with its data in ./data, on 127.0.0.1:8080 (override
# with STARLEASE_LISTEN). The server pepper is created once in
# ./starlease.pepper, outside the data directory, mode 0600. The server
# prints how to create the first administrator key; stop it with Ctrl-C.
#
# Needs Go (see go.mod for the version), which it never downloads. As root
# on Debian it also installs what the test suite (the second quick-start
# command) starts: redis-server and rabbitmq-server with apt, pouchdb-server
# and the OpenAPI linter @redocly/cli with npm into a cache outside the
# repository (.ci/install-servers.sh).
set -euo pipefail

cd "$(dirname "$0")/.."

. scripts/lib.sh
require_go

# The tests (the second quick-start command) start real redis-server,
# rabbitmq-server and pouchdb-server processes on 127.0.0.1, and run the
# Python and Nim client suites.
if [[ $(id -u) == 0 ]]; then
	echo "# checking what the tests need (the first run installs it: apt a few minutes, npm about 30 s)"
	bash .ci/install-servers.sh >/dev/null
else
	echo "# note: the tests need redis-server, rabbitmq-server, pouchdb-server and redocly; install them as root with: sudo bash .ci/install-servers.sh"
fi

go build -o bin/starlease ./cmd/starlease
echo "# built bin/starlease ($(bin/starlease version | head -n1))"

PEPPER=./starlease.pepper
if [[ ! -f $PEPPER ]]; then
	(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PEPPER")
	echo "# created the server pepper $PEPPER (keep it secret; keys are unusable without it)"
fi

exec bin/starlease serve --data-dir ./data --pepper-file "$PEPPER" --listen "${STARLEASE_LISTEN:-127.0.0.1:8080}"

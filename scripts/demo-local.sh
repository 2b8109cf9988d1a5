#!/usr/bin/env bash
# Local demo: build starlease and drive the embedded default backend (bolt,
# one file) in ./demo-data with the CLI's local mode — no server. Needs Go
# (see go.mod for the version), which it never downloads.
set -euo pipefail

cd "$(dirname "$0")/.."

. scripts/lib.sh
require_go
echo "# using $(go version)"

# --- build ----------------------------------------------------------------
go build -o bin/starlease ./cmd/starlease
BIN=./bin/starlease
echo "# built $BIN ($($BIN version))"

# --- demo -----------------------------------------------------------------
DATA=./demo-data
ID=(--data-dir "$DATA" --tenant demo --program quickstart --namespace web --target example.com --actor demo-scanner)

# field NAME reads one field of the printed lease (lease fields are indented
# four spaces in the pretty-printed result).
field() { sed -n -E "s/^    \"$1\": \"?([^\",]*)\"?,?\$/\1/p" | head -n1; }

step() { printf '\n$ starlease %s\n' "$*"; }

# A lease left active by an earlier run would make the first acquire
# conflict: release it first (fencing counters are durable, so tokens
# continue from where that run left them).
if out=$("$BIN" inspect "${ID[@]}" 2>/dev/null) && [[ $(field state <<<"$out") == active ]]; then
	echo "# releasing the active lease left by an earlier run"
	"$BIN" release "${ID[@]}" --lease-id "$(field lease_id <<<"$out")" --token "$(field fencing_token <<<"$out")" >/dev/null
fi

step acquire "${ID[@]}" --ttl 30s
out=$("$BIN" acquire "${ID[@]}" --ttl 30s)
echo "$out"
lease_id=$(field lease_id <<<"$out")
token=$(field fencing_token <<<"$out")

step inspect "${ID[@]}"
"$BIN" inspect "${ID[@]}"

step renew "${ID[@]}" --lease-id "$lease_id" --token "$token" --ttl 60s
"$BIN" renew "${ID[@]}" --lease-id "$lease_id" --token "$token" --ttl 60s

step release "${ID[@]}" --lease-id "$lease_id" --token "$token"
"$BIN" release "${ID[@]}" --lease-id "$lease_id" --token "$token"

step acquire "${ID[@]}"
out=$("$BIN" acquire "${ID[@]}")
echo "$out"
lease_id2=$(field lease_id <<<"$out")
token2=$(field fencing_token <<<"$out")
execution2=$(field execution_id <<<"$out")
job2=$(field job_id <<<"$out")

if ((token2 <= token)); then
	echo "fencing token did not increase: $token then $token2" >&2
	exit 1
fi
echo
echo "# fencing token went from $token to $token2: every new acquisition gets a strictly greater token."

cat <<NEXT

Next commands to try (the lease above stays active for 30 s):
  # a second acquire conflicts: exit status 3, JSON error envelope on stderr
  $BIN acquire ${ID[*]}
  # list the active leases of the program
  $BIN list --data-dir $DATA --tenant demo --program quickstart
  # authorize one fenced write (of document doc-1) under the lease
  $BIN authorize-commit ${ID[*]} --lease-id $lease_id2 --token $token2 --sink couchdb --execution $execution2 --job $job2 --write-target doc-1
  # release it, then read the identity's terminal history
  $BIN release ${ID[*]} --lease-id $lease_id2 --token $token2
  $BIN history ${ID[*]}
  # every command, the output format and the exit statuses
  $BIN help
NEXT

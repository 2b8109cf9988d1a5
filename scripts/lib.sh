# Sourced by the scripts in this directory, from the repository root.

# require_go puts /usr/local/go/bin on PATH and checks that Go is at least
# the version go.mod names; it never downloads a toolchain.
require_go() {
	if [[ -x /usr/local/go/bin/go ]]; then
		export PATH=/usr/local/go/bin:$PATH
	fi
	local need have=none
	need=$(sed -n 's/^go \([0-9][0-9.]*\)$/\1/p' go.mod)
	if command -v go >/dev/null 2>&1; then
		have=$(go env GOVERSION | sed 's/^go//')
	fi
	if [[ $have == none ]] || [[ $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1) != "$need" ]]; then
		cat >&2 <<MSG
starlease needs Go $need or later (found: $have).

Install it from the official Go downloads page: download the linux archive
for this machine (for example go${need}.linux-amd64.tar.gz), then
    sudo rm -rf /usr/local/go && sudo tar -C /usr/local -xzf go${need}.linux-amd64.tar.gz
and run this script again (it adds /usr/local/go/bin to PATH itself).
MSG
		exit 1
	fi
	export GOTOOLCHAIN=local # never fetch another toolchain behind the user's back
}

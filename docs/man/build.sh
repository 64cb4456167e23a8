#!/bin/sh
# Builds the man pages fulcrum(8) and fulcrum.toml(5) with go-md2man into
# OUTDIR. fulcrum.toml(5) is docs/configuration.md itself, with its key
# tables turned into definition lists (so that the page fits 80 columns)
# and its links into plain text, so that the two cannot drift.
#
#	docs/man/build.sh OUTDIR VERSION
set -eu
out=$1
version=$2
here=$(dirname "$0")
if ! command -v go-md2man >/dev/null; then
	echo "docs/man/build.sh: go-md2man is needed for the man pages (Debian: apt-get install go-md2man)" >&2
	exit 1
fi
mkdir -p "$out"

# configuration.md without its title, links or wide tables.
body=$(mktemp)
trap 'rm -f "$body" "$body.md"' EXIT
awk '
NR == 1 && /^# / { next }
/^<!-- man: skip/ { skip = 1; next }
/^<!-- man: end -->/ { skip = 0; next }
skip { next }
function cell(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
/^\|/ {
	n = split($0, c, "|")
	if (!intable) { # the header row
		intable = 1
		keys = cell(c[2]) == "key" && cell(c[3]) == "where"
		for (i = 3; i < n; i++) head[i] = cell(c[i])
		next
	}
	if (cell(c[2]) ~ /^-+$/) next
	if (keys) {
		printf "%s\n:   In %s. Default: %s. %s\n\n", cell(c[2]), cell(c[3]), cell(c[4]), cell(c[5])
	} else {
		printf "%s\n:  ", cell(c[2])
		for (i = 3; i < n; i++) printf " %s%s%s.", (head[i] == "" ? "" : head[i] ": "), cell(c[i]), ""
		printf "\n\n"
	}
	next
}
{ intable = 0; print }
' "$here/../configuration.md" |
	sed -E 's/\[([^]]+)\]\([^)]*\)/\1/g' |
	# roff takes a line that starts with a dot or a quote for a request: join
	# such a line to the one before it (outside code blocks).
	awk '
	/^```/ { code = !code }
	!code && NR > 1 && /^[.\047]/ && prev != "" { prev = prev " " $0; next }
	NR > 1 { print prev }
	{ prev = $0 }
	END { print prev }
	' >"$body"

sed "s/@VERSION@/$version/" "$here/fulcrum.8.md" >"$body.md"
go-md2man -in "$body.md" -out "$out/fulcrum.8"
awk -v body="$body" '/^@CONFIGURATION@$/ { while ((getline l < body) > 0) print l; next } { print }' \
	"$here/fulcrum.toml.5.md" | sed "s/@VERSION@/$version/" >"$body.md"
go-md2man -in "$body.md" -out "$out/fulcrum.toml.5"

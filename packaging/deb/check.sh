#!/bin/sh
# Checks a built package the way an operator would meet it, then removes it:
# lintian without errors, dpkg -i, the installed unit verified by systemd
# (man pages included, since Documentation= names them), the installed
# example configuration validated by the installed binary, the man pages
# rendered, the conffile registered, and a purge that leaves nothing behind.
#
#	packaging/deb/check.sh build/fulcrum_VERSION_ARCH.deb
#
# It needs root and installs into the running system: CI runs it.
set -eu
deb=$1
if dpkg -s fulcrum >/dev/null 2>&1; then
	echo "check.sh: fulcrum is installed already; refusing to replace it" >&2
	exit 1
fi

# lintian exits non-zero on errors; warnings and notes are shown, not fatal.
lintian --fail-on error --tag-display-limit 0 "$deb"

dpkg -i "$deb"
trap 'dpkg --purge fulcrum >/dev/null 2>&1 || true' EXIT
dpkg-query -W -f '${Conffiles}\n' fulcrum | grep -q '^ /etc/fulcrum/fulcrum.toml '
(cd /lib/systemd/system && systemd-analyze verify fulcrum.socket fulcrum.service)
grep -q '^ExecStart=/usr/bin/fulcrum -config /etc/fulcrum/fulcrum.toml$' /lib/systemd/system/fulcrum.service
/usr/bin/fulcrum -check -config /etc/fulcrum/fulcrum.toml >/dev/null
test -z "$(/usr/bin/fulcrum -check -q -config /etc/fulcrum/fulcrum.toml)"
/usr/bin/fulcrum version
for page in fulcrum.8 fulcrum.toml.5; do
	warnings=$(MANWIDTH=80 man --warnings -l "/usr/share/man/man${page##*.}/$page.gz" 2>&1 >/dev/null)
	if [ -n "$warnings" ]; then
		echo "check.sh: man $page: $warnings" >&2
		exit 1
	fi
done
test -f /usr/share/bash-completion/completions/fulcrum

dpkg --purge fulcrum
trap - EXIT
for f in /usr/bin/fulcrum /lib/systemd/system/fulcrum.service /etc/fulcrum/fulcrum.toml; do
	if [ -e "$f" ]; then
		echo "check.sh: $f is left after the purge" >&2
		exit 1
	fi
done
echo "check.sh: $deb passes"

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
# source = "client"'s capability is an opt-in drop-in: shipped, not enabled,
# and the main unit does not grant it.
test -f /usr/share/fulcrum/transparent.conf
test ! -e /lib/systemd/system/fulcrum.service.d/transparent.conf
if grep -q CAP_NET_ADMIN /lib/systemd/system/fulcrum.service; then
	echo "check.sh: the main unit grants CAP_NET_ADMIN; only the opt-in drop-in may" >&2
	exit 1
fi
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
# The documentation the man pages name is installed.
for f in README.md.gz operations.md.gz databases.md.gz schedulers.md.gz configuration.md.gz \
	monitoring/fulcrum.rules.yml examples/fulcrum.toml; do
	test -f "/usr/share/doc/fulcrum/$f"
done
/usr/bin/fulcrum -check -q -config /usr/share/doc/fulcrum/examples/fulcrum.toml

# The password-file recipe of databases.md under the unit as shipped
# (DynamicUser=yes), the way systemd runs it (systemd is not PID 1 here, so
# its steps are played by hand): the unit with the documented
# LoadCredential= line verifies; a root-owned 0400 file, which the old
# recipe used, cannot be read by an unprivileged uid; the credential, copied
# into $CREDENTIALS_DIRECTORY readable by the service's user only (as
# systemd copies it), can, and -check passes as that user; and a password
# file others can read is warned about.
lab=$(mktemp -d)
trap 'rm -rf "$lab"; dpkg --purge fulcrum >/dev/null 2>&1 || true' EXIT
sed 's/^#LoadCredential=/LoadCredential=/' /lib/systemd/system/fulcrum.service >"$lab/fulcrum.service"
grep -q '^LoadCredential=pg.pw:/etc/fulcrum/credentials/pg.pw$' "$lab/fulcrum.service"
(cd "$lab" && systemd-analyze verify ./fulcrum.service)
chmod 0755 "$lab"
install -d -m 0755 "$lab/etc" "$lab/creds"
printf 'secret\n' >"$lab/etc/pg.pw"
chmod 0400 "$lab/etc/pg.pw"
cat >"$lab/etc/fulcrum.toml" <<'EOF2'
[defaults.health]
check         = "pgsql"
password_file = "$CREDENTIALS_DIRECTORY/pg.pw"
[services.ro]
listen    = ["127.0.0.1:15433"]
scheduler = "wlc"
backends  = [{ name = "pg1", address = "127.0.0.1:5432" }]
EOF2
chmod 0644 "$lab/etc/fulcrum.toml"
as_dynamic() { setpriv --reuid=61999 --regid=61999 --clear-groups "$@"; }
if CREDENTIALS_DIRECTORY="$lab/etc" as_dynamic /usr/bin/fulcrum -check -q -config "$lab/etc/fulcrum.toml" 2>/dev/null; then
	echo "check.sh: a root-owned 0400 password file was readable by an unprivileged uid; the test proves nothing" >&2
	exit 1
fi
install -m 0400 -o 61999 -g 61999 "$lab/etc/pg.pw" "$lab/creds/pg.pw"
chmod 0500 "$lab/creds" && chown 61999:61999 "$lab/creds"
CREDENTIALS_DIRECTORY="$lab/creds" as_dynamic /usr/bin/fulcrum -check -q -config "$lab/etc/fulcrum.toml"
chmod 0644 "$lab/etc/pg.pw"
CREDENTIALS_DIRECTORY="$lab/etc" /usr/bin/fulcrum -check -config "$lab/etc/fulcrum.toml" 2>&1 >/dev/null |
	grep -q "password file $lab/etc/pg.pw is readable by others"
rm -rf "$lab"
trap 'dpkg --purge fulcrum >/dev/null 2>&1 || true' EXIT

dpkg --purge fulcrum
trap - EXIT
for f in /usr/bin/fulcrum /lib/systemd/system/fulcrum.service /etc/fulcrum/fulcrum.toml /usr/share/fulcrum/transparent.conf; do
	if [ -e "$f" ]; then
		echo "check.sh: $f is left after the purge" >&2
		exit 1
	fi
done
echo "check.sh: $deb passes"

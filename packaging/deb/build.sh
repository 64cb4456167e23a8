#!/bin/sh
# Builds the Debian package of fulcrum with dpkg-deb into OUTDIR:
#
#	VERSION=… COMMIT=… DATE=… packaging/deb/build.sh OUTDIR
#
# dpkg-deb rather than nfpm or debhelper: it is in every Debian system
# already, the package is one static binary plus data files, and writing
# the few control files by hand keeps every byte of the package in view.
# The tree is staged with `make install` (PREFIX=/usr, units in
# /lib/systemd/system as on Debian 12), so the package and a source install
# cannot differ.
set -eu
out=$1
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
: "${VERSION:=$(git -C "$top" describe --tags --always --dirty 2>/dev/null || echo dev)}"
: "${COMMIT:=$(git -C "$top" rev-parse HEAD 2>/dev/null || true)}"
: "${DATE:=$(date -u +%Y-%m-%dT%H:%M:%SZ)}"
arch=$(dpkg --print-architecture)

# A Debian version must start with a digit: v1.2.3-4-gabc → 1.2.3+4+gabc;
# a bare commit (no tag yet) → 0~git.abc.
case $VERSION in
v[0-9]* | [0-9]*) debver=$(echo "${VERSION#v}" | sed 's/-/+/g') ;;
*) debver=0~git.$(echo "$VERSION" | sed 's/-/./g') ;;
esac

mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
make -C "$top" --no-print-directory install DESTDIR="$root" PREFIX=/usr UNITDIR=/lib/systemd/system \
	ZSHCOMPDIR=/usr/share/zsh/vendor-completions VERSION="$VERSION" COMMIT="$COMMIT" DATE="$DATE" \
	LDFLAGS="-s -w -X main.version=$VERSION -X main.commit=$COMMIT -X main.date=$DATE" >/dev/null
# make install keeps an existing file; the stage is new, so this is the example.
test -f "$root/etc/fulcrum/fulcrum.toml"

# Debian's layout: compressed man pages, copyright and changelog.
gzip -9n "$root/usr/share/man/man8/fulcrum.8" "$root/usr/share/man/man5/fulcrum.toml.5"
doc=$root/usr/share/doc/fulcrum
install -d "$doc"
install -m 0644 "$here/copyright" "$doc/copyright"
# The documentation the man pages send readers to, as in the source tree
# (the man pages' own sources and the design notes for contributors left
# out), and the example configuration.
install -m 0644 "$top/README.md" "$doc/README.md"
for f in "$top"/docs/*.md; do
	case ${f##*/} in design.md) continue ;; esac
	install -m 0644 "$f" "$doc/${f##*/}"
done
for d in monitoring keepalived bird consul-template kubernetes; do
	install -d "$doc/$d"
	find "$top/docs/$d" -maxdepth 1 -type f -exec install -m 0644 {} "$doc/$d/" \;
done
install -d "$doc/examples"
install -m 0644 "$top/systemd/fulcrum.toml" "$doc/examples/fulcrum.toml"
# Debian policy: documentation over 4 KiB is compressed (links between
# the pages then name .md files that are .md.gz; readers follow them by name).
find "$doc" -type f -size +4k ! -name copyright ! -name '*.gz' ! -name '*.json' ! -name '*.yml' ! -name '*.toml' -exec gzip -9n {} +
{
	echo "fulcrum ($debver) unstable; urgency=medium"
	echo
	echo "  * Built from commit ${COMMIT:-unknown}."
	echo
	echo " -- fulcrum maintainers <maintainers@users.noreply.a-seed-8d57cda8.example>  $(date -u -R -d "$DATE")"
} | gzip -9n >"$doc/changelog.gz"

install -d "$root/usr/share/lintian/overrides"
install -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/fulcrum"

install -d -m 0755 "$root/DEBIAN"
size=$(du -k -s --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$debver/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" "$here/control" >"$root/DEBIAN/control"
echo /etc/fulcrum/fulcrum.toml >"$root/DEBIAN/conffiles"
for s in postinst prerm postrm; do
	install -m 0755 "$here/$s" "$root/DEBIAN/$s"
done
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -print | sed 's|^\./||' | sort | xargs md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"
find "$root" -type d -exec chmod 0755 {} +

deb=$out/fulcrum_${debver}_$arch.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"

#!/usr/bin/env bash
# Puts the source of the fio that Debian 12 ships (3.33, with Debian's patches), configured the
# way Debian builds it, where the nvmf-fio crate's build finds its headers (fio has no -dev
# package: an external engine is built against fio's source tree, as SPDK's fio plugin is).
#   scripts/fio-source.sh [DIR]     default DIR: $NVMF_FIO_SRC or /usr/local/src/fio-3.33
# Idempotent (a stamp names the version). Called by scripts/setup.sh. Downloads from Debian's
# archive with apt-get source (a deb-src entry in a private apt configuration: the system's
# sources are not touched).
set -euo pipefail
VERSION=3.33-3
DIR=${1:-${NVMF_FIO_SRC:-/usr/local/src/fio-3.33}}
die() { echo "fio-source.sh: $*" >&2; exit 1; }

if [ -f "$DIR/.nvmf-fio-source" ] && [ "$(cat "$DIR/.nvmf-fio-source")" = "$VERSION" ] \
   && [ -f "$DIR/config-host.h" ] && [ -f "$DIR/fio.h" ]; then
  exit 0
fi
sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
source "$(dirname "$0")/apt-lib.sh"
apt_ensure fio-source dpkg-dev make gcc zlib1g-dev

work=$(mktemp -d /tmp/fio-source.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial"
echo "deb-src http://deb.debian.org/debian bookworm main" >"$work/sources.list"
apt=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root)
mkdir -p "$work/cache/archives/partial"
echo "fio-source.sh: fetching fio $VERSION's source from Debian's archive" >&2
(cd "$work" && apt-get -q "${apt[@]}" update >/dev/null \
   && apt-get -q "${apt[@]}" source --download-only "fio=$VERSION" >/dev/null) \
  || die "apt-get source fio=$VERSION failed (Debian's archive unreachable?)"
(cd "$work" && dpkg-source --no-check -x "fio_$VERSION.dsc" src >/dev/null) \
  || die "dpkg-source could not unpack fio_$VERSION.dsc"
# Debian's configure line (debian/rules) less the front ends it adds (gfio, libnbd): they add
# engines and a GUI, not fields of the structures an engine sees.
(cd "$work/src" && ./configure --disable-native --prefix=/usr >/dev/null) \
  || die "fio's configure failed"
[ -f "$work/src/config-host.h" ] || die "fio's configure wrote no config-host.h"
echo "$VERSION" >"$work/src/.nvmf-fio-source"
$sudo rm -rf "$DIR"
$sudo mkdir -p "$(dirname "$DIR")"
$sudo cp -a "$work/src" "$DIR"
echo "fio-source.sh: fio $VERSION source in $DIR" >&2

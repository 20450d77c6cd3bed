#!/bin/sh
# meson install script: install SRC as DST (an absolute path: a file under sysconfdir) unless
# DST exists, so a reinstall never overwrites an operator's edited configuration. DESTDIR,
# when meson install has one, goes in front of DST.
set -eu
src=$1
dst=${DESTDIR:-}$2
if [ -e "$dst" ]; then
	echo "kept $dst (exists; the shipped default is $src)"
	exit 0
fi
mkdir -p "$(dirname "$dst")"
cp "$src" "$dst.tmp.$$"
chmod 0644 "$dst.tmp.$$"
mv "$dst.tmp.$$" "$dst"
echo "Installing $src to $dst"

#!/usr/bin/env bash
# Makes the base image localhost/debian:bookworm-slim without a registry:
# debootstrap (minbase) from a Debian mirror, made like the official slim
# image (apt sources with updates and security, dpkg leaving out docs, man
# pages and locales but keeping copyrights, no host files), then `podman
# import`. Skipped when the image exists and was made by this version of the
# script (its hash is a label): podman's storage is the cache between runs.
set -euo pipefail
IMAGE=${BASE_IMAGE:-localhost/debian:bookworm-slim}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
recipe=$(sha256sum "$0" | cut -c1-16)
if [ "$(podman image inspect --format '{{index .Labels "dev.tce.base-recipe"}}' "$IMAGE" 2>/dev/null)" = "$recipe" ]; then
  echo "base image $IMAGE: cached"
  exit 0
fi
root=$(mktemp -d /var/tmp/tce-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$MIRROR" >/dev/null

rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
  "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/var/log/*.log
# The host's name and resolver stay on the host; the runtime provides its own.
: >"$root/etc/hostname"
: >"$root/etc/resolv.conf"

tar -C "$root" -c . | podman import -q --change 'CMD ["/bin/bash"]' \
  --change "LABEL dev.tce.base-recipe=$recipe" - "$IMAGE" >/dev/null
echo "base image $IMAGE: built"

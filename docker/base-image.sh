#!/usr/bin/env bash
# Produces the base image localhost/debian:bookworm-slim offline-friendly:
# debootstrap (minbase) from the Debian mirror apt already uses, trimmed of
# docs, locales and apt lists, then `podman import`. Skipped when the image
# exists (podman's storage is the cache between runs).
set -euo pipefail
IMAGE=${BASE_IMAGE:-localhost/debian:bookworm-slim}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if podman image exists "$IMAGE"; then
  echo "base image $IMAGE: cached"
  exit 0
fi
root=$(mktemp -d /var/tmp/tce-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$MIRROR" >/dev/null
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
  "$root"/var/cache/apt/archives/*.deb "$root"/var/log/*.log
tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "base image $IMAGE: built"

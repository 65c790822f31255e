#!/usr/bin/env bash
# Times `make demo` from a fresh Debian 12 system, the figure the README's
# Quickstart gives. It makes a minimal bookworm root with debootstrap, adds
# what a new machine has before anyone types a command (Python 3 with pip
# and venv, gcc, g++, make, CMake, git), clones this checkout's HEAD into it
# and runs `time make demo` there in a chroot. Root only; every mount lives
# in a private mount namespace, so nothing is bound on the host's paths.
# The host's apt sources, CA certificates and pip settings (an index or
# wheel directory on local disk included) are carried in, as a machine set
# up the same way would have them. Not part of `make test`.
#
# Usage: tests/fresh_demo.sh [WORKDIR]   (default: a new directory in /var/tmp)
# Output: WORKDIR/demo.log; WORKDIR can be removed afterwards.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repo" rev-parse HEAD)
work=${1:-$(mktemp -d /var/tmp/tce-fresh-demo.XXXXXX)}
root=$work/root
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" = 0 ] || { echo "fresh_demo.sh: needs root (debootstrap, chroot)" >&2; exit 1; }
mkdir -p "$work"

echo "fresh root in $root"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1
cp /etc/resolv.conf "$root/etc/"
if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
  cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/" && rm -f "$root/etc/apt/sources.list"
fi

# Directories on local disk that pip's settings name (find-links, file://
# indexes, a constraints file): bound read-only at the same path inside.
binds=$(python3 - <<'EOF'
import os, subprocess
vals = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True,
                      text=True).stdout.splitlines()
vals = [v.split("=", 1)[1].strip("'") for v in vals if "=" in v]
vals += [v for k, v in os.environ.items() if k.startswith("PIP_")]
dirs = set()
for v in " ".join(vals).split():
    p = v[len("file://"):] if v.startswith("file://") else v
    if p.startswith("/") and os.path.exists(p) and not p.startswith("/etc/ssl"):
        d = p if os.path.isdir(p) else os.path.dirname(p)
        # an index (.../simple) links to its files beside it
        dirs.add(os.path.dirname(d) if os.path.basename(d) == "simple" else d)
print(" ".join(sorted(dirs)))
EOF
)
pip_env=$(env | grep '^PIP_' | tr '\n' ' ' || true)

inside() {  # runs "$1" in the root, its mounts private to this call
  unshare -m --propagation private bash -c "
    for d in proc sys dev dev/pts dev/shm; do mount --bind /\$d '$root'/\$d; done
    for d in $binds; do mkdir -p '$root'\$d && mount --bind -o ro \$d '$root'\$d; done
    chroot '$root' env -i HOME=/root $pip_env \
      PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -c '$1'"
}

echo "adding what a new machine has: Python 3 (pip, venv), gcc, g++, make, CMake, git"
inside "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends python3 python3-venv python3-pip python3-dev gcc g++ make cmake git \
  ca-certificates >/dev/null" >"$work/base.log" 2>&1
rm -f "$root"/var/cache/apt/archives/*.deb
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
for f in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
  [ -f "$f" ] && mkdir -p "$root$(dirname "${f/#$HOME//root}")" && cp "$f" "$root${f/#$HOME//root}"
done
inside "python3 -m venv /opt/venv"
git clone -q "$repo" "$root/root/tce" && git -C "$root/root/tce" checkout -q "$commit"

echo "time make demo at $commit (log: $work/demo.log)"
inside "cd /root/tce && time make demo PYTHON=/opt/venv/bin/python" 2>&1 | tee "$work/demo.log"

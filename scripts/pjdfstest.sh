#!/usr/bin/env bash
# The POSIX suite pjdfstest (the Rust rewrite, from crates.io) run as root
# over a foliofs FUSE mount: it switches to other users, so it also checks
# that a root mount serves them. Fails if any test fails; fsck afterwards.
# Usage: scripts/pjdfstest.sh [FOLIOFS_BINARY] [--object URL]
# With --object, over a new object image at URL (s3://BUCKET/PREFIX, the
# store from the AWS_* variables) instead of an image file:
# scripts/object-s3.py BIN --pjdfstest runs it against SeaweedFS.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/foliofs}")
image=
if [ "${2:-}" = --object ]; then
  image=${3:?--object needs the URL of a new object image}
fi
pjd=target/pjdfstest/bin/pjdfstest
if [ ! -x "$pjd" ]; then
  cargo install --locked -q pjdfstest --version 0.2.2 --root target/pjdfstest
fi
# The suite's dummy users: nobody/nogroup and tests/tests.
getent group tests >/dev/null || groupadd tests
id tests >/dev/null 2>&1 || useradd -g tests -M -s /usr/sbin/nologin tests
tmp=$(mktemp -d /var/tmp/foliofs-pjd.XXXXXX)
chmod 0755 "$tmp" # the dummy users walk down to the mount
cleanup() { umount -l "$tmp/mnt" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
cat > "$tmp/pjd.toml" <<'TOML'
[features]
posix_fallocate = {}
utimensat = {}
utime_now = {}
rename_ctime = {}

[settings]
naptime = 0.02
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["tests", "tests"]]
TOML
mkdir "$tmp/mnt"
image=${image:-$tmp/fs.img}
"$bin" mkfs "$image" --size 1G >/dev/null
"$bin" mount "$image" "$tmp/mnt" -o "log=$tmp/daemon.log"
mkdir -m 0777 "$tmp/mnt/t"
status=0
"$pjd" -c "$tmp/pjd.toml" -p "$tmp/mnt/t" > "$tmp/out" 2>&1 || status=$?
grep -E "FAILED|^Summary" "$tmp/out" || tail -20 "$tmp/out"
"$bin" umount "$tmp/mnt"
"$bin" fsck "$image"
if [ "$status" -ne 0 ]; then
  echo "pjdfstest: failures (full output above the summary in $tmp/out)" >&2
  sed -n '/FAILED/,/^$/p' "$tmp/out" >&2
  exit 1
fi

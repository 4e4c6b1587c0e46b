#!/usr/bin/env bash
# CPU per byte through a foliofs mount, binaries side by side: for each
# round and each binary (alternated), a fresh 4 GiB image mounted by that
# binary, 1 GiB written with dd (1 MiB writes, conv=fsync) and read back
# with O_DIRECT; prints MiB/s and the CPU seconds (user + system) of the
# daemon and of the caller for each phase; then remounts it and reads it
# cold through the page cache (dd bs=1M, the kernel's read-ahead).
# Usage (as root): scripts/mount-cpu.sh ROUNDS BINARY [BINARY ...]
# FOLIOFS_BENCH_DIR picks where the image goes (default /var/tmp/foliofs-cpu).
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "mount-cpu: run as root (FUSE mounts, drop_caches)" >&2; exit 1; }
[ $# -ge 2 ] || { echo "usage: $0 ROUNDS BINARY [BINARY ...]" >&2; exit 2; }
rounds=$1; shift
work=${FOLIOFS_BENCH_DIR:-/var/tmp/foliofs-cpu}
mkdir -p "$work/mnt"
tck=$(getconf CLK_TCK)
cleanup() { mountpoint -q "$work/mnt" && umount "$work/mnt"; rm -f "$work/image"; }
trap cleanup EXIT
printf "%-24s %-6s %8s %12s %12s\n" binary phase MiB/s "daemon CPU" "caller CPU"
for _ in $(seq "$rounds"); do
  for bin in "$@"; do
    cleanup
    "$bin" mkfs "$work/image" --size 4G >/dev/null
    "$bin" mount "$work/image" "$work/mnt" -o log="$work/log"
    pid=$(pgrep -f "mount --foreground $work/image" | head -1)
    for phase in write read cold; do
      if [ $phase = cold ]; then
        "$bin" umount "$work/mnt"
        "$bin" mount "$work/image" "$work/mnt" -o log="$work/log"
        pid=$(pgrep -n -f "mount --foreground $work/image")
        echo 3 > /proc/sys/vm/drop_caches
      fi
      a=$(awk '{print $14 + $15}' "/proc/$pid/stat")
      s=$(date +%s.%N)
      if [ $phase = write ]; then
        /usr/bin/time -f "%U %S" -o "$work/time" \
          dd if=/dev/zero of="$work/mnt/big" bs=1M count=1024 conv=fsync status=none
      elif [ $phase = read ]; then
        echo 3 > /proc/sys/vm/drop_caches
        /usr/bin/time -f "%U %S" -o "$work/time" \
          dd if="$work/mnt/big" of=/dev/null bs=1M iflag=direct status=none
      else
        /usr/bin/time -f "%U %S" -o "$work/time" \
          dd if="$work/mnt/big" of=/dev/null bs=1M status=none
      fi
      e=$(date +%s.%N)
      b=$(awk '{print $14 + $15}' "/proc/$pid/stat")
      printf "%-24s %-6s %8.0f %10.2f s %10.2f s\n" "$(basename "$bin")" $phase \
        "$(echo "1024 / ($e - $s)" | bc -l)" "$(echo "($b - $a) / $tck" | bc -l)" \
        "$(awk '{print $1 + $2}' "$work/time")"
    done
  done
done

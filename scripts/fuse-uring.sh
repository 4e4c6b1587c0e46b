#!/usr/bin/env bash
# Turn FUSE over io_uring on where the kernel has it, and let requests span
# 257 pages (fs.fuse.max_pages_limit), now (the module parameter, the
# sysctl) and, for the rings, for the next boot (a modprobe.d file for a loadable fuse;
# where fuse is built in, a note on the kernel command line instead, which
# only the operator's boot loader can change). Says what it did. As root.
set -euo pipefail
cd "$(dirname "$0")/.."
param=/sys/module/fuse/parameters/enable_uring
[ -e /sys/module/fuse ] || modprobe fuse 2>/dev/null || true
if [ ! -e "$param" ]; then
  echo "fuse-uring: this kernel has no FUSE over io_uring (Linux 6.14+ with CONFIG_FUSE_IO_URING): mounts serve /dev/fuse"
  exit 0
fi
if [ "$(cat "$param")" = Y ]; then
  echo "fuse-uring: FUSE over io_uring is already on ($param is Y)"
elif echo Y > "$param" 2>/dev/null; then
  echo "fuse-uring: turned FUSE over io_uring on ($param: N -> Y)"
else
  echo "fuse-uring: cannot write $param: mounts serve /dev/fuse until it is Y" >&2
fi
# Requests of 257 pages, so that a 1 MiB write() from a buffer not aligned
# to a page is one request rather than two (foliofs-fuse's `max_pages`).
limit=/proc/sys/fs/fuse/max_pages_limit
if [ -e "$limit" ] && [ "$(cat "$limit")" -lt 257 ]; then
  if echo 257 > "$limit" 2>/dev/null; then
    echo "fuse-uring: fs.fuse.max_pages_limit raised to 257 (whole 1 MiB requests from unaligned buffers)"
  else
    echo "fuse-uring: cannot write $limit: a 1 MiB write from an unaligned buffer goes as two requests" >&2
  fi
fi
# /sys/module/M/initstate exists only for a module loaded at run time.
if [ -e /sys/module/fuse/initstate ]; then
  install -D -m 0644 packaging/foliofs-modprobe.conf /etc/modprobe.d/foliofs.conf
  echo "fuse-uring: on at the next boot too (/etc/modprobe.d/foliofs.conf: options fuse enable_uring=1)"
elif grep -qE '(^| )fuse\.enable_uring=(1|Y|y)( |$)' /proc/cmdline; then
  echo "fuse-uring: on at the next boot too (fuse.enable_uring=1 is on the kernel command line)"
else
  echo "fuse-uring: fuse is built into this kernel, so a modprobe.d file does not reach it: to keep the"
  echo "  rings on after a reboot, add fuse.enable_uring=1 to the kernel command line (Debian with GRUB:"
  echo "  GRUB_CMDLINE_LINUX in /etc/default/grub, then update-grub); until then run this script after boot"
fi

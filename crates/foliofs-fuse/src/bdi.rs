//! The kernel's backing device (`/sys/class/bdi/MAJ:MIN`) of a FUSE
//! mount: how much of the mount's cached writes it holds (`space`), and
//! how far it reads ahead (`set_read_ahead`). The device is found in
//! /proc/self/mountinfo, which, unlike stat, does not ask the mount.

use std::path::{Path, PathBuf};

/// The sysfs directory of the FUSE mount at `mount_point`'s backing
/// device, if it is mounted.
pub(crate) fn dir(mount_point: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mount_point.to_str()?;
    // Fields: id parent MAJ:MIN root mountpoint options ... - type source ...
    let dev = info
        .lines()
        .rev()
        .filter(|l| l.split(' ').nth(4) == Some(want))
        .find(|l| l.split(" - ").nth(1).is_some_and(|t| t.starts_with("fuse")))?
        .split(' ')
        .nth(2)?
        .to_string();
    Some(PathBuf::from(format!("/sys/class/bdi/{dev}")))
}

/// The most the kernel holds of cached writes for the mount: its dirty
/// limit for the device (`max_bytes`, Linux 6.2+).
pub(crate) fn dirty_limit(mount_point: &Path) -> Option<u64> {
    let v = std::fs::read_to_string(dir(mount_point)?.join("max_bytes")).ok()?;
    v.trim().parse().ok().filter(|&b: &u64| b > 0)
}

/// Have the kernel read ahead `bytes` of a sequential reader of the
/// mount. The kernel takes the read-ahead of a FUSE mount from INIT,
/// where it offers 128 KiB at most; the device's setting (root only)
/// may be raised after it.
pub(crate) fn set_read_ahead(mount_point: &Path, bytes: u64) -> std::io::Result<()> {
    let d = dir(mount_point).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the mount is not in mountinfo",
        )
    })?;
    std::fs::write(d.join("read_ahead_kb"), format!("{}\n", bytes >> 10))
}

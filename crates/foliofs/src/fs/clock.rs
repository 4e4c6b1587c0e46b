//! The clocks a file's timestamps come from.

use crate::format::inode::Timespec;

/// The time the system clock reads, to the nanosecond (mkfs).
pub(crate) fn now_precise() -> Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

/// The time for a file's timestamps: the kernel's coarse clock (one tick,
/// a few milliseconds), the one Linux stamps files with. Through a FUSE
/// mount with the writeback cache the kernel sets mtime and ctime itself
/// from that clock: stamps the engine makes (a create's atime, a rename's
/// ctime) must come from it too, or a new file's atime lands after the
/// kernel's later mtime and relatime never updates it. Writes within a
/// tick also leave the inode record unchanged and out of the transaction.
pub(crate) fn now() -> Timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
        return Timespec {
            sec: ts.tv_sec,
            nsec: ts.tv_nsec as u32,
        };
    }
    now_precise()
}

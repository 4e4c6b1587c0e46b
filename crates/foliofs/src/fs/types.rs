//! Public value types of the engine API.

pub use crate::format::dirent::NAME_MAX;
pub use crate::format::inode::{FileType, Timespec, S_IFMT, S_ISGID, S_ISUID};
use serde::Serialize;

/// A node to make (`Fs::mknod`): its kind, permission bits, the
/// creator's umask (taken off the bits unless the parent has a default
/// ACL, which decides instead), owner, device number (character and
/// block devices) and symlink target.
#[derive(Clone, Copy, Debug)]
pub struct NewNode<'a> {
    pub kind: FileType,
    pub perm: u32,
    pub umask: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub target: Option<&'a [u8]>,
}

impl NewNode<'_> {
    /// A node of `kind` with `perm`, owned by `uid`:`gid`, no umask.
    pub fn new(kind: FileType, perm: u32, uid: u32, gid: u32) -> Self {
        NewNode {
            kind,
            perm,
            umask: 0,
            uid,
            gid,
            rdev: 0,
            target: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// Bytes of device space allocated to the file.
    pub allocated: u64,
    pub kind: FileType,
    /// Permission bits (mode & 0o7777).
    pub perm: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub crtime: (i64, u32),
    pub blksize: u32,
    pub generation: u32,
    /// The user's inode flags (`FL_*`, as chattr sets them).
    pub flags: u32,
}

/// Inode flags as chattr(1) and lsattr(1) see them (the values of
/// Linux's FS_IOC_GETFLAGS): `Fs::set_flags`, `Attr::flags`. The engine
/// enforces immutable and append-only itself, for every caller.
pub const FL_IMMUTABLE: u32 = 0x10;
pub const FL_APPEND: u32 = 0x20;
pub const FL_NODUMP: u32 = 0x40;
pub const FL_NOATIME: u32 = 0x80;
/// Synchronous updates: a file's writes and changes, a directory's
/// entries, are durable when the call returns (as the `sync` mount
/// option, for one file or directory).
pub const FL_SYNC: u32 = 0x8;
/// A directory's entries are changed synchronously (as `dirsync`).
pub const FL_DIRSYNC: u32 = 0x1_0000;
/// The flags an inode can carry.
pub const FL_SUPPORTED: u32 =
    FL_IMMUTABLE | FL_APPEND | FL_NODUMP | FL_NOATIME | FL_SYNC | FL_DIRSYNC;
/// The flags a new inode takes from its directory (as XFS and ext4
/// do); a directory also passes on FL_DIRSYNC to new directories.
pub const FL_INHERITED: u32 = FL_NODUMP | FL_NOATIME | FL_SYNC;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: FileType,
    pub name: Vec<u8>,
    /// Pass this back to `readdir` to continue after this entry.
    pub cookie: u64,
}

#[derive(Clone, Copy, Debug)]
pub enum TimeSet {
    Now,
    At(Timespec),
}

#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// Set the change time to this instead of now (a FUSE kernel that
    /// caches writes owns the times and hands them over).
    pub ctime: Option<TimeSet>,
    /// Also take set-user-ID, set-group-ID (when group-executable) and
    /// the file capability, as a chown or an unprivileged truncate does
    /// (`Fs::kill_priv`); an explicit `mode` wins.
    pub kill_priv: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// rename(2) flags.
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Falloc {
    /// Allocate unwritten blocks; extend the size unless `keep_size`.
    Allocate { keep_size: bool },
    /// Deallocate; the size never changes.
    PunchHole,
    /// Make the range read as zeros, leaving it allocated (unwritten).
    ZeroRange { keep_size: bool },
}

impl Falloc {
    /// The operation fallocate(2)'s `mode` asks for: KEEP_SIZE,
    /// PUNCH_HOLE (with KEEP_SIZE, as Linux requires) and ZERO_RANGE; any
    /// other bit is unsupported (EOPNOTSUPP).
    pub fn from_linux(mode: i32) -> crate::error::Result<Falloc> {
        use libc::FALLOC_FL_ZERO_RANGE as ZERO;
        use libc::{FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH};
        let keep_size = mode & KEEP != 0;
        match mode {
            m if m & !(KEEP | PUNCH | ZERO) != 0 => Err(crate::error::Error::Unsupported(
                "fallocate modes other than keep size, punch hole and zero range",
            )),
            m if m & PUNCH != 0 && (!keep_size || m & ZERO != 0) => {
                Err(crate::error::Error::Invalid(
                    "a hole is punched with FALLOC_FL_KEEP_SIZE and alone".into(),
                ))
            }
            m if m & PUNCH != 0 => Ok(Falloc::PunchHole),
            m if m & ZERO != 0 => Ok(Falloc::ZeroRange { keep_size }),
            _ => Ok(Falloc::Allocate { keep_size }),
        }
    }
}

/// A directory listing from `cookie` on, fetched in batches by `fetch`
/// (`Fs::readdir` or `Fs::readdir_attrs` from a cookie), each entry handed
/// to `add` until it says to stop (it returns that, and the entry's
/// cookie) or the directory ends.
pub fn listing<T>(
    mut cookie: u64,
    fetch: impl Fn(u64) -> crate::error::Result<Vec<T>>,
    mut add: impl FnMut(T) -> (bool, u64),
) -> crate::error::Result<()> {
    loop {
        let batch = fetch(cookie)?;
        if batch.is_empty() {
            return Ok(());
        }
        for e in batch {
            let (stop, next) = add(e);
            if stop {
                return Ok(());
            }
            cookie = next;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whence {
    Data,
    Hole,
}

/// One extent of a file's map, for `stat` and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ExtentInfo {
    pub offset: u64,
    pub device_block: u64,
    pub blocks: u64,
    pub unwritten: bool,
}

pub const SYMLINK_MAX: usize = 4095;
pub const XATTR_NAME_MAX: usize = 255;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallocate_modes_read_as_linux_defines_them() {
        assert_eq!(
            Falloc::from_linux(0).unwrap(),
            Falloc::Allocate { keep_size: false }
        );
        assert_eq!(
            Falloc::from_linux(libc::FALLOC_FL_KEEP_SIZE).unwrap(),
            Falloc::Allocate { keep_size: true }
        );
        assert_eq!(
            Falloc::from_linux(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).unwrap(),
            Falloc::PunchHole
        );
        assert_eq!(
            Falloc::from_linux(libc::FALLOC_FL_ZERO_RANGE).unwrap(),
            Falloc::ZeroRange { keep_size: false }
        );
        let errno = |m| Falloc::from_linux(m).unwrap_err().errno();
        assert_eq!(errno(libc::FALLOC_FL_PUNCH_HOLE), libc::EINVAL);
        assert_eq!(
            errno(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_ZERO_RANGE
            ),
            libc::EINVAL
        );
        assert_eq!(errno(libc::FALLOC_FL_COLLAPSE_RANGE), libc::EOPNOTSUPP);
        assert_eq!(errno(libc::FALLOC_FL_INSERT_RANGE), libc::EOPNOTSUPP);
    }
}

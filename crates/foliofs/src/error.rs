//! Engine errors. Two kinds of failure are kept apart: bugs in our code may
//! `assert!`, but bytes read from the device never panic; they come back as
//! [`Error::Corrupted`] naming the structure, its address and what is wrong.
//! errno appears only in adapters (FUSE, C ABI) through [`Error::errno`].

use std::io;

/// Result type used throughout the engine.
pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A structure read from the device failed verification.
    #[error("corrupted {structure} at block {addr}: {reason}")]
    Corrupted {
        structure: &'static str,
        addr: u64,
        reason: String,
    },
    /// A data block did not match its stored crc32c.
    #[error("data checksum mismatch: inode {ino} offset {offset} device block {addr}")]
    DataChecksum { ino: u64, offset: u64, addr: u64 },
    /// Neither superblock slot carries the superblock magic: the device
    /// never held a foliofs file system (or was overwritten whole), which
    /// is not damage to one.
    #[error("not a foliofs image (no foliofs superblock magic at block 0 or 1)")]
    NotFoliofs,
    #[error("device I/O error: {0}")]
    Io(#[from] io::Error),
    /// The file system shut itself down after a failed journal write or flush.
    #[error("file system is shut down: {0}")]
    Shutdown(String),
    #[error("file system is read-only")]
    ReadOnly,
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("no space left on device")]
    NoSpace,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("file name too long")]
    NameTooLong,
    #[error("file too large")]
    FileTooBig,
    #[error("too many links")]
    TooManyLinks,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value too large")]
    AttrTooBig,
    #[error("operation not supported: {0}")]
    Unsupported(&'static str),
    /// The inode's flags forbid it (chattr +i, +a), or setting a flag
    /// needs a privilege the caller lacks.
    #[error("operation not permitted: {0}")]
    NotPermitted(&'static str),
}

impl Error {
    pub(crate) fn corrupted(structure: &'static str, addr: u64, reason: impl Into<String>) -> Self {
        Error::Corrupted {
            structure,
            addr,
            reason: reason.into(),
        }
    }

    /// The errno an adapter should return for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Corrupted { .. } => libc::EUCLEAN,
            Error::DataChecksum { .. } => libc::EIO,
            // What mount(2) answers for a device of another file system.
            Error::NotFoliofs => libc::EINVAL,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::Shutdown(_) => libc::EIO,
            Error::ReadOnly => libc::EROFS,
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NoSpace => libc::ENOSPC,
            Error::Invalid(_) => libc::EINVAL,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::FileTooBig => libc::EFBIG,
            Error::TooManyLinks => libc::EMLINK,
            Error::NoAttr => libc::ENODATA,
            Error::AttrTooBig => libc::E2BIG,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::NotPermitted(_) => libc::EPERM,
        }
    }
}

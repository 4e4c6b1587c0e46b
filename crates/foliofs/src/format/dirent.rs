//! A directory entry, stored in the directory's data fork keyed by name
//! hash.
//!
//! Key: bit 63 set, 47 bits of xxh3(name) in bits 16..63, and a
//! collision counter in bits 0..16. Entries with the same hash take the
//! lowest free counter, below `MAX_COLLISIONS`. Value: inode u64, d_type
//! u8, then the name.
//!
//! The readdir cookie is the key folded below 2^63 (`cookie_of`): the
//! hash, then the counter's 15 bits, plus 3. A cookie is a file offset
//! (getdents' d_off, telldir, lseek) and those are signed: one at or past
//! 2^63 is negative, and lseek refuses it. It stays valid however the
//! directory changes, and orders as the keys do (0, 1 and 2 are "start",
//! "." and "..").

use crate::error::{Error, Result};
use crate::format::inode::FileType;

/// Longest file name.
pub const NAME_MAX: usize = 255;

pub const COOKIE_DOT: u64 = 1;
pub const COOKIE_DOTDOT: u64 = 2;

/// Names one hash may hold: the counter's values that fold into a cookie.
pub const MAX_COLLISIONS: u64 = 1 << 15;

pub fn name_key(name: &[u8]) -> u64 {
    let h = xxhash_rust::xxh3::xxh3_64(name) & ((1 << 47) - 1);
    (1 << 63) | (h << 16)
}

/// The readdir cookie of the entry with key `key`: in [3, 2^62 + 2].
pub fn cookie_of(key: u64) -> u64 {
    let hash = (key >> 16) & ((1 << 47) - 1);
    ((hash << 15) | (key & (MAX_COLLISIONS - 1))) + COOKIE_DOTDOT + 1
}

/// The first key whose cookie is above `cookie`: a listing resumes there.
pub fn key_after(cookie: u64) -> u64 {
    let Some(c) = cookie.checked_sub(COOKIE_DOTDOT + 1) else {
        return 1 << 63;
    };
    if c >= 1 << 62 {
        // Past every entry's cookie.
        return u64::MAX;
    }
    ((1 << 63) | ((c >> 15) << 16) | (c & (MAX_COLLISIONS - 1))) + 1
}

#[derive(Clone, Debug)]
pub struct Dirent {
    pub key: u64,
    pub ino: u64,
    pub kind: FileType,
    pub name: Vec<u8>,
}

/// Decode the entry of directory `dir` under `key`.
pub fn decode(dir: u64, key: u64, v: &[u8]) -> Result<Dirent> {
    if v.len() < 10 || v.len() > 9 + NAME_MAX {
        return Err(Error::corrupted(
            "directory entry",
            dir,
            format!("directory {dir}: entry of {} bytes", v.len()),
        ));
    }
    let kind = FileType::from_dtype(v[8]).ok_or_else(|| {
        Error::corrupted(
            "directory entry",
            dir,
            format!("directory {dir}: bad type {}", v[8]),
        )
    })?;
    let name = v[9..].to_vec();
    if key & !0xffff != name_key(&name) {
        return Err(Error::corrupted(
            "directory entry",
            dir,
            format!("directory {dir}: entry hash does not match its name"),
        ));
    }
    Ok(Dirent {
        key,
        ino: u64::from_le_bytes(v[..8].try_into().unwrap()),
        kind,
        name,
    })
}

/// The value of an entry for `ino` of type `kind` named `name`.
pub fn encode(ino: u64, kind: FileType, name: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + name.len());
    v.extend_from_slice(&ino.to_le_bytes());
    v.push(kind.dtype());
    v.extend_from_slice(name);
    v
}

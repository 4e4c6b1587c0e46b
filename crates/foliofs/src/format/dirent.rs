//! A directory entry, stored in the directory's data fork keyed by name
//! hash.
//!
//! Key: bit 63 set, 47 bits of xxh3(name) in bits 16..63, and a 16-bit
//! collision counter in bits 0..16. Entries with the same hash take the
//! lowest free counter. The key is also the readdir cookie, so a cookie
//! stays valid however the directory changes (0, 1 and 2 are "start", "."
//! and ".."). Value: inode u64, d_type u8, then the name.

use crate::error::{Error, Result};
use crate::format::inode::FileType;

/// Longest file name.
pub const NAME_MAX: usize = 255;

pub const COOKIE_DOT: u64 = 1;
pub const COOKIE_DOTDOT: u64 = 2;

pub fn name_key(name: &[u8]) -> u64 {
    let h = xxhash_rust::xxh3::xxh3_64(name) & ((1 << 47) - 1);
    (1 << 63) | (h << 16)
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

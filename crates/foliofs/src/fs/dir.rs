//! Directory entries, stored in the data fork keyed by name hash.
//!
//! Key: bit 63 set, 47 bits of xxh3(name) in bits 16..63, and a 16-bit
//! collision counter in bits 0..16. Entries with the same hash take the
//! lowest free counter. The key is also the readdir cookie, so a cookie
//! stays valid however the directory changes (0, 1 and 2 are "start", "."
//! and ".."). Value: inode u64, d_type u8, then the name.

use super::inode::Inode;
use super::types::{FileType, NAME_MAX};
use super::Ctx;
use crate::error::{Error, Result};

pub const COOKIE_DOT: u64 = 1;
pub const COOKIE_DOTDOT: u64 = 2;

pub fn name_key(name: &[u8]) -> u64 {
    let h = xxhash_rust::xxh3::xxh3_64(name) & ((1 << 47) - 1);
    (1 << 63) | (h << 16)
}

pub fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(Error::Invalid(format!(
            "bad file name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

#[derive(Clone, Debug)]
pub struct Dirent {
    pub key: u64,
    pub ino: u64,
    pub kind: FileType,
    pub name: Vec<u8>,
}

pub(crate) fn decode(dir: u64, key: u64, v: &[u8]) -> Result<Dirent> {
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

fn encode(ino: u64, kind: FileType, name: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + name.len());
    v.extend_from_slice(&ino.to_le_bytes());
    v.push(kind.dtype());
    v.extend_from_slice(name);
    v
}

impl Inode {
    /// Entries sharing `name`'s hash.
    fn dir_bucket(&self, cx: &mut Ctx, name: &[u8]) -> Result<Vec<Dirent>> {
        let base = name_key(name);
        let mut out = Vec::new();
        for (k, v) in self.kv_scan(cx, base, 1)? {
            if k > base | 0xffff {
                break;
            }
            out.push(decode(self.d.ino, k, &v)?);
        }
        Ok(out)
    }

    pub fn dir_lookup(&self, cx: &mut Ctx, name: &[u8]) -> Result<Option<Dirent>> {
        Ok(self
            .dir_bucket(cx, name)?
            .into_iter()
            .find(|d| d.name == name))
    }

    pub fn dir_add(&mut self, cx: &mut Ctx, name: &[u8], ino: u64, kind: FileType) -> Result<()> {
        let bucket = self.dir_bucket(cx, name)?;
        if bucket.iter().any(|d| d.name == name) {
            return Err(Error::Exists);
        }
        let base = name_key(name);
        let key = (0..=0xffffu64)
            .map(|c| base | c)
            .find(|k| !bucket.iter().any(|d| d.key == *k))
            .ok_or(Error::NoSpace)?;
        self.kv_put(cx, key, &encode(ino, kind, name))
    }

    pub fn dir_remove(&mut self, cx: &mut Ctx, name: &[u8]) -> Result<Dirent> {
        let d = self.dir_lookup(cx, name)?.ok_or(Error::NotFound)?;
        self.kv_del(cx, d.key)?;
        Ok(d)
    }

    /// Point an existing entry at another inode (rename over a target).
    pub fn dir_replace(
        &mut self,
        cx: &mut Ctx,
        name: &[u8],
        ino: u64,
        kind: FileType,
    ) -> Result<()> {
        let d = self.dir_lookup(cx, name)?.ok_or(Error::NotFound)?;
        self.kv_put(cx, d.key, &encode(ino, kind, name))
    }

    /// Entries with cookie > `after`, at least `min` if there are.
    pub fn dir_list(&self, cx: &mut Ctx, after: u64, min: usize) -> Result<Vec<Dirent>> {
        let from = after.saturating_add(1).max(1 << 63);
        self.kv_scan(cx, from, min)?
            .into_iter()
            .map(|(k, v)| decode(self.d.ino, k, &v))
            .collect()
    }

    pub fn dir_is_empty(&self, cx: &mut Ctx) -> Result<bool> {
        Ok(self.kv_scan(cx, 0, 1)?.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_cookies_above_dot_entries() {
        let k = name_key(b"hello");
        assert!(k > COOKIE_DOTDOT);
        assert_eq!(k & 0xffff, 0);
        assert_ne!(name_key(b"a"), name_key(b"b"));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name(b"ok").is_ok());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert!(check_name(bad).is_err());
        }
        assert!(matches!(check_name(&[b'x'; 256]), Err(Error::NameTooLong)));
    }

    #[test]
    fn corrupt_entries_are_errors() {
        let v = encode(5, FileType::File, b"x");
        assert!(decode(1, name_key(b"x"), &v).is_ok());
        assert!(decode(1, name_key(b"y"), &v).is_err());
        let mut bad = v.clone();
        bad[8] = 99;
        assert!(decode(1, name_key(b"x"), &bad).is_err());
        assert!(decode(1, name_key(b"x"), &v[..5]).is_err());
    }
}

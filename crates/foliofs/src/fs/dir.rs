//! Directories: entries stored in the data fork keyed by name hash
//! (`format::dirent` has the encoding).

use super::inode::Inode;
use super::types::FileType;
use crate::error::{Error, Result};
use crate::format::dirent::NAME_MAX;
pub use crate::format::dirent::{
    cookie_of, decode, encode, key_after, name_key, Dirent, COOKIE_DOT, COOKIE_DOTDOT,
    MAX_COLLISIONS,
};
use crate::fs::ctx::Ctx;

/// Where fsck's repair names what lost its name (`Fs::reconnect`).
pub const LOST_FOUND: &[u8] = b"lost+found";

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

impl Inode {
    /// Entries sharing `name`'s hash.
    fn dir_bucket(&self, cx: &mut Ctx, name: &[u8]) -> Result<Vec<Dirent>> {
        let base = name_key(name);
        self.kv_range(cx, base, base | 0xffff, usize::MAX)?
            .into_iter()
            .map(|(k, v)| decode(self.d.ino, k, &v))
            .collect()
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
        let key = (0..MAX_COLLISIONS)
            .map(|c| base | c)
            .find(|k| !bucket.iter().any(|d| d.key == *k))
            .ok_or(Error::NoSpace)?;
        self.entries_changed(cx);
        self.kv_put(cx, key, &encode(ino, kind, name))
    }

    pub fn dir_remove(&mut self, cx: &mut Ctx, name: &[u8]) -> Result<Dirent> {
        let d = self.dir_lookup(cx, name)?.ok_or(Error::NotFound)?;
        self.entries_changed(cx);
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
        self.entries_changed(cx);
        self.kv_put(cx, d.key, &encode(ino, kind, name))
    }

    /// The first `max` entries with readdir cookies above `after`.
    pub fn dir_list(&self, cx: &mut Ctx, after: u64, max: usize) -> Result<Vec<Dirent>> {
        self.kv_scan(cx, key_after(after), max)?
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
    fn cookies_are_offsets_above_the_dot_entries_in_key_order() {
        let k = name_key(b"hello");
        assert_eq!(k & 0xffff, 0);
        assert_ne!(name_key(b"a"), name_key(b"b"));
        // The extremes of the key space, and keys side by side.
        let lowest = 1u64 << 63;
        let highest = lowest | (((1 << 47) - 1) << 16) | (MAX_COLLISIONS - 1);
        let mut keys = vec![
            lowest,
            lowest + 1,
            k,
            k + 1,
            k + 0x7ffe,
            k + 0x7fff,
            highest,
        ];
        keys.push(k + (1 << 16));
        keys.sort();
        let cookies: Vec<u64> = keys.iter().map(|&k| cookie_of(k)).collect();
        for (i, (&key, &c)) in keys.iter().zip(&cookies).enumerate() {
            // A signed file offset, past "." and "..".
            assert!(
                c > COOKIE_DOTDOT && c <= i64::MAX as u64,
                "{key:#x} -> {c:#x}"
            );
            assert!(i == 0 || c > cookies[i - 1], "cookies follow key order");
            // A listing after this cookie starts past this key and at or
            // before the next.
            assert!(key_after(c) > key);
            if let Some(&next) = keys.get(i + 1) {
                assert!(key_after(c) <= next);
            }
        }
        assert_eq!(key_after(0), lowest);
        assert_eq!(key_after(COOKIE_DOTDOT), lowest);
        assert_eq!(key_after(i64::MAX as u64), u64::MAX);
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

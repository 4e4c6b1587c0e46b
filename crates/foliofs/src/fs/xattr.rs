//! Extended attributes: a per-inode B+tree keyed like directory entries
//! (name hash plus collision counter). Value: name length u8, name, value.
//! A value must fit one tree leaf: up to block size - 340 bytes
//! (3,756 bytes at 4 KiB blocks).

use super::dir::name_key;
use super::types::XATTR_NAME_MAX;
use super::Inner;
use crate::btree::max_value_len;
use crate::error::{Error, Result};

type Entry = (u64, Vec<u8>);

pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;

fn check(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX || name.contains(&0) {
        return Err(Error::Invalid("bad xattr name".into()));
    }
    Ok(())
}

impl Inner {
    /// (key, value) of attribute `name`, and the keys in its hash bucket.
    fn xattr_find(&mut self, ino: u64, name: &[u8]) -> Result<(Option<Entry>, Vec<u64>)> {
        let ag = self.meta.geo.inode_ag(ino);
        let (ip, cx) = self.with(ino)?;
        let base = name_key(name);
        let mut keys = Vec::new();
        let mut found = None;
        for (k, v) in ip.xattr_tree(ag).scan(cx.meta, ip.d.xattr_root, base, 1)? {
            if k > base | 0xffff {
                break;
            }
            keys.push(k);
            let nl = *v
                .first()
                .ok_or_else(|| Error::corrupted("xattr", ino, "empty xattr entry"))?
                as usize;
            if v.len() < 1 + nl {
                return Err(Error::corrupted(
                    "xattr",
                    ino,
                    format!("inode {ino}: xattr entry shorter than its name"),
                ));
            }
            if &v[1..1 + nl] == name {
                found = Some((k, v[1 + nl..].to_vec()));
            }
        }
        Ok((found, keys))
    }

    pub fn getxattr(&mut self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        check(name)?;
        self.xattr_find(ino, name)?
            .0
            .map(|(_, v)| v)
            .ok_or(Error::NoAttr)
    }

    pub fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        check(name)?;
        if 1 + name.len() + value.len() > max_value_len(self.meta.geo.block_size) {
            return Err(Error::AttrTooBig);
        }
        let (found, keys) = self.xattr_find(ino, name)?;
        if found.is_some() && flags & XATTR_CREATE != 0 {
            return Err(Error::Exists);
        }
        if found.is_none() && flags & XATTR_REPLACE != 0 {
            return Err(Error::NoAttr);
        }
        let base = name_key(name);
        let key = match found {
            Some((k, _)) => k,
            None => (0..=0xffffu64)
                .map(|c| base | c)
                .find(|k| !keys.contains(k))
                .ok_or(Error::NoSpace)?,
        };
        let mut v = Vec::with_capacity(1 + name.len() + value.len());
        v.push(name.len() as u8);
        v.extend_from_slice(name);
        v.extend_from_slice(value);
        let ag = self.meta.geo.inode_ag(ino);
        let (ip, mut cx) = self.with(ino)?;
        let mut root = ip.d.xattr_root;
        ip.xattr_tree(ag)
            .insert(cx.meta, cx.alloc, &mut root, key, &v)?;
        ip.d.xattr_root = root;
        ip.touch_ctime();
        ip.store(&mut cx)
    }

    pub fn listxattr(&mut self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let ag = self.meta.geo.inode_ag(ino);
        let (ip, cx) = self.with(ino)?;
        let mut out = Vec::new();
        let tree = ip.xattr_tree(ag);
        let mut key = 0;
        loop {
            let batch = tree.scan(cx.meta, ip.d.xattr_root, key, 64)?;
            let Some(last) = batch.last().map(|(k, _)| *k) else {
                return Ok(out);
            };
            for (_, v) in batch {
                let nl = v.first().copied().unwrap_or(0) as usize;
                if v.len() < 1 + nl {
                    return Err(Error::corrupted(
                        "xattr",
                        ino,
                        format!("inode {ino}: xattr entry shorter than its name"),
                    ));
                }
                out.push(v[1..1 + nl].to_vec());
            }
            if last == u64::MAX {
                return Ok(out);
            }
            key = last + 1;
        }
    }

    pub fn removexattr(&mut self, ino: u64, name: &[u8]) -> Result<()> {
        check(name)?;
        let (found, _) = self.xattr_find(ino, name)?;
        let (key, _) = found.ok_or(Error::NoAttr)?;
        let ag = self.meta.geo.inode_ag(ino);
        let (ip, mut cx) = self.with(ino)?;
        let mut root = ip.d.xattr_root;
        ip.xattr_tree(ag)
            .remove(cx.meta, cx.alloc, &mut root, key)?;
        ip.d.xattr_root = root;
        ip.touch_ctime();
        ip.store(&mut cx)
    }
}

//! Extended attributes: a per-inode B+tree keyed like directory entries
//! (name hash plus a 16-bit counter that tells colliding entries apart).
//!
//! Values up to 64 KiB, split over several entries (`format::xattr`).
//!
//! The POSIX ACL attributes (`acl.rs`) also keep the mode bits true.

use super::acl::{self, Acl};
use super::dir::name_key;
use super::types::{FileType, S_ISGID, XATTR_NAME_MAX};
use crate::btree::max_value_len;
use crate::error::{Error, Result};
pub use crate::format::xattr::XATTR_VALUE_MAX;
use crate::format::xattr::{assemble, cont, head, piece, Piece, CONT_HEADER};
use crate::fs::state::Inner;

pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;

fn check(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX || name.contains(&0) {
        return Err(Error::Invalid("bad xattr name".into()));
    }
    Ok(())
}

/// An attribute found in its bucket.
struct Found {
    key: u64,
    value: Vec<u8>,
    /// Keys of its continuations.
    conts: Vec<u64>,
}

impl Inner {
    /// Attribute `name`, and every key in use in its hash bucket.
    fn xattr_find(&mut self, ino: u64, name: &[u8]) -> Result<(Option<Found>, Vec<u64>)> {
        let ag = self.meta.geo.inode_ag(ino);
        let (ip, cx) = self.with(ino)?;
        let base = name_key(name);
        let bad = |why: &str| Error::corrupted("xattr", ino, format!("inode {ino}: {why}"));
        // The whole bucket (a large value's fragments fill a leaf each).
        let entries = ip.xattr_tree(ag).scan_range(
            cx.meta,
            ip.d.xattr_root,
            base,
            base | 0xffff,
            usize::MAX,
        )?;
        let keys = entries.iter().map(|(k, _)| *k).collect();
        let mut head = None;
        let mut conts = Vec::new();
        for (k, v) in &entries {
            match piece(v).ok_or_else(|| bad("malformed xattr entry"))? {
                Piece::Head { name: n, data } if n == name => head = Some((*k, data)),
                Piece::Head { .. } => {}
                Piece::Cont { head, index, data } => conts.push((*k, head, index, data)),
            }
        }
        let Some((key, first)) = head else {
            return Ok((None, keys));
        };
        let c = (key & 0xffff) as u16;
        let list: Vec<_> = conts.iter().map(|&(_, h, i, d)| (h, i, d)).collect();
        let value = assemble(first, c, &list).map_err(|e| bad(&e))?;
        let conts = conts.iter().filter(|x| x.1 == c).map(|x| x.0).collect();
        Ok((Some(Found { key, value, conts }), keys))
    }

    pub fn getxattr(&mut self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        check(name)?;
        self.xattr_find(ino, name)?
            .0
            .map(|f| f.value)
            .ok_or(Error::NoAttr)
    }

    /// Set an attribute. The POSIX ACLs are validated; setting the access
    /// ACL sets the mode bits it implies (stored only when it says more
    /// than they do) and, set by a caller outside the file's group
    /// (`in_group` says no, asked only then), takes set-group-ID, as
    /// Linux's posix_acl_update_mode.
    pub fn setxattr(
        &mut self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        in_group: impl FnOnce(u32) -> bool,
    ) -> Result<()> {
        check(name)?;
        self.check_unfrozen(ino, false)?;
        if value.len() > XATTR_VALUE_MAX {
            return Err(Error::AttrTooBig);
        }
        if name == acl::ACCESS || name == acl::DEFAULT {
            let a = Acl::decode(value)?;
            let (ip, mut cx) = self.with(ino)?;
            if name == acl::DEFAULT && ip.kind() != FileType::Dir {
                return Err(Error::Invalid("a default ACL on a non-directory".into()));
            }
            if name == acl::ACCESS {
                ip.d.mode = (ip.d.mode & !0o777) | a.mode();
                if ip.d.mode & S_ISGID != 0 && !in_group(ip.d.gid) {
                    ip.d.mode &= !S_ISGID;
                }
                ip.touch_ctime();
                ip.store(&mut cx)?;
                if a.is_minimal() {
                    return match self.removexattr(ino, name) {
                        Err(Error::NoAttr) => Ok(()),
                        r => r,
                    };
                }
            }
        }
        self.xattr_put(ino, name, value, flags)
    }

    /// Store `value` under `name` as it is.
    pub(super) fn xattr_put(
        &mut self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        let (found, mut keys) = self.xattr_find(ino, name)?;
        if found.is_some() && flags & XATTR_CREATE != 0 {
            return Err(Error::Exists);
        }
        if found.is_none() && flags & XATTR_REPLACE != 0 {
            return Err(Error::NoAttr);
        }
        let base = name_key(name);
        let ag = self.meta.geo.inode_ag(ino);
        let max = max_value_len(self.meta.geo.block_size);
        let (ip, mut cx) = self.with(ino)?;
        let tree = ip.xattr_tree(ag);
        let mut root = ip.d.xattr_root;
        // The old value's continuations go; its head key stays.
        if let Some(f) = &found {
            for k in &f.conts {
                tree.remove(cx.meta, cx.alloc, &mut root, *k)?;
            }
            keys.retain(|k| !f.conts.contains(k));
        }
        let mut free = (0..=0xffffu64)
            .map(|c| base | c)
            .filter(|k| !keys.contains(k));
        let key = match &found {
            Some(f) => f.key,
            None => free.next().ok_or(Error::NoSpace)?,
        };
        let first = value.len().min(max - 1 - name.len());
        tree.insert(
            cx.meta,
            cx.alloc,
            &mut root,
            key,
            &head(name, &value[..first]),
        )?;
        for (i, chunk) in value[first..].chunks(max - CONT_HEADER).enumerate() {
            let k = free.next().ok_or(Error::NoSpace)?;
            let v = cont((key & 0xffff) as u16, i as u16 + 1, chunk);
            tree.insert(cx.meta, cx.alloc, &mut root, k, &v)?;
        }
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
            for (_, v) in &batch {
                match piece(v) {
                    Some(Piece::Head { name, .. }) => out.push(name.to_vec()),
                    Some(Piece::Cont { .. }) => {}
                    None => {
                        return Err(Error::corrupted(
                            "xattr",
                            ino,
                            format!("inode {ino}: malformed xattr entry"),
                        ))
                    }
                }
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
        let f = found.ok_or(Error::NoAttr)?;
        let ag = self.meta.geo.inode_ag(ino);
        let (ip, mut cx) = self.with(ino)?;
        let mut root = ip.d.xattr_root;
        let tree = ip.xattr_tree(ag);
        for k in std::iter::once(f.key).chain(f.conts) {
            tree.remove(cx.meta, cx.alloc, &mut root, k)?;
        }
        ip.d.xattr_root = root;
        ip.touch_ctime();
        ip.store(&mut cx)
    }

    /// chmod of a node with an access ACL: its owner, mask and other
    /// entries follow the new mode.
    pub(super) fn acl_chmod(&mut self, ino: u64, mode: u32) -> Result<()> {
        let v = match self.getxattr(ino, acl::ACCESS) {
            Ok(v) => v,
            Err(Error::NoAttr) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut a = Acl::decode(&v)?;
        a.chmod(mode);
        self.xattr_put(ino, acl::ACCESS, &a.encode(), XATTR_REPLACE)
    }

    /// The default ACL of directory `dir`, if it has one.
    pub(super) fn default_acl(&mut self, dir: u64) -> Result<Option<Acl>> {
        match self.getxattr(dir, acl::DEFAULT) {
            Ok(v) => Acl::decode(&v).map(Some),
            Err(Error::NoAttr) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

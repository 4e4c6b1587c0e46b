//! The inode table in memory: loading inodes, allocating and freeing
//! them, and the orphan list (inodes without names, freed at their last
//! close or at the next mount).

use super::inode::{Fork, Inode};
use crate::books::take;
use crate::btree::Tree;
use crate::error::{Error, Result};
use crate::format::ag_header::AgHeader;
use crate::format::btree_node::TreeType;
use crate::format::inode::{DiskInode, ForkFormat, FLAG_ORPHAN, INODE_SIZE};
use crate::format::magic;
use crate::fs::ctx::Ctx;
use crate::fs::state::Inner;
use crate::fs::types::{FileType, S_IFMT};

/// Inodes kept in memory before loading another lets go of the unused
/// ones (closed, clean, holding nothing).
pub(crate) const INODES_KEPT: usize = 65536;

/// The orphan list's tree (keys: inode numbers).
pub(crate) fn orphan_tree() -> Tree {
    Tree {
        owner: 0,
        tt: TreeType::Orphans,
        ag: 0,
    }
}

impl Inner {
    /// Make sure inode `ino` is in the cache.
    pub fn load_inode(&mut self, ino: u64) -> Result<()> {
        if self.inodes.contains_key(&ino) {
            return Ok(());
        }
        let geo = &self.meta.geo;
        if ino == 0 || ino >= geo.max_ino() {
            return Err(Error::NotFound);
        }
        let (blk, off) = geo.inode_loc(ino);
        let uuid = self.meta.uuid;
        let buf = self.meta.read_itable(blk)?;
        let slot = &buf[off..off + INODE_SIZE];
        if DiskInode::is_blank(slot) {
            return Err(Error::NotFound);
        }
        let d = DiskInode::decode(slot, ino, blk, &uuid)?;
        if d.mode == 0 {
            return Err(Error::NotFound);
        }
        let ip = Inode::from_disk(d, blk)?;
        if self.inodes_trim_at.due(self.inodes.len() as u64 + 1) {
            let mut freed = 0;
            self.inodes.retain(|_, i| {
                // Pinned, dirty, holding reservations or an unpublished
                // size: stays.
                let keep = i.open > 0
                    || i.cache.any_dirty()
                    || i.prealloc.is_some()
                    || i.delalloc > 0
                    || i.size != i.d.size
                    || i.dirtied_at.is_some();
                if !keep {
                    freed += i.cache.bytes();
                }
                keep
            });
            take(&mut self.cache_bytes, freed, "cached bytes");
            crate::fs::counters::bump(&self.counters.inode_trims, 1);
            // A pass walks every inode. When most had to stay (a large
            // untar's dirty files), the next waits until half the limit
            // more are in memory, not for the next load.
            let (kept, left) = (INODES_KEPT as u64, self.inodes.len() as u64);
            self.inodes_trim_at.walked(kept, left, kept / 2);
        }
        self.inodes.insert(ino, ip);
        Ok(())
    }

    /// The cached inode and the context to change it with.
    pub fn with(&mut self, ino: u64) -> Result<(&mut Inode, Ctx<'_>)> {
        self.load_inode(ino)?;
        let (inodes, cx, _) = self.split();
        Ok((inodes.get_mut(&ino).unwrap(), cx))
    }

    /// Allocate and initialise a new inode in AG `ag`.
    pub fn new_inode(&mut self, ag: u32, mode: u32, uid: u32, gid: u32) -> Result<u64> {
        let ino = self.alloc.alloc_inode(&mut self.meta, ag)?;
        let (blk, off) = self.meta.geo.inode_loc(ino);
        let uuid = self.meta.uuid;
        let old = &self.meta.read_itable(blk)?[off..off + INODE_SIZE];
        // Keep generations increasing across reuse of the slot.
        let generation = if DiskInode::is_blank(old) {
            1
        } else {
            DiskInode::decode(old, ino, blk, &uuid)?
                .generation
                .wrapping_add(1)
        };
        let t = crate::fs::clock::now();
        let mut d = DiskInode::new(ino);
        d.mode = mode;
        d.uid = uid;
        d.gid = gid;
        d.nlink = 1;
        d.atime = t;
        d.mtime = t;
        d.ctime = t;
        d.crtime = t;
        d.generation = generation;
        let is_dir = mode & S_IFMT == 0o040000;
        d.fork = if is_dir {
            ForkFormat::DirInline
        } else {
            ForkFormat::Extents
        };
        let mut ip = Inode::new(d, Fork::Inline(Vec::new()));
        let mut cx = self.ctx();
        ip.store(&mut cx)?;
        self.inodes.insert(ino, ip);
        Ok(ino)
    }

    fn orphan_root(&mut self) -> Result<u64> {
        let blk = self.meta.geo.agh_blk(0);
        Ok(
            AgHeader::decode(self.meta.read(blk, magic::AG_HEADER, "AG header")?, blk, 0)?
                .orphan_root,
        )
    }

    fn set_orphan_root(&mut self, root: u64) -> Result<()> {
        let blk = self.meta.geo.agh_blk(0);
        let mut h = AgHeader::decode(self.meta.read(blk, magic::AG_HEADER, "AG header")?, blk, 0)?;
        if h.orphan_root != root {
            h.orphan_root = root;
            let uuid = self.meta.uuid;
            h.encode(self.meta.write(blk), blk, uuid);
        }
        Ok(())
    }

    pub fn orphan_add(&mut self, ino: u64) -> Result<()> {
        let mut root = self.orphan_root()?;
        orphan_tree().insert(&mut self.meta, &mut self.alloc, &mut root, ino, &[])?;
        self.set_orphan_root(root)?;
        let (ip, mut cx) = self.with(ino)?;
        ip.d.flags |= FLAG_ORPHAN;
        ip.store(&mut cx)
    }

    pub(in crate::fs) fn orphan_remove(&mut self, ino: u64) -> Result<()> {
        let mut root = self.orphan_root()?;
        orphan_tree().remove(&mut self.meta, &mut self.alloc, &mut root, ino)?;
        self.set_orphan_root(root)
    }

    /// Free an unlinked inode and everything it owns. An inode whose
    /// extents are a tree may be freed in steps, each committed (a long
    /// file): it is on the orphan list while this runs, so a crash part-way
    /// is finished by the next mount. One with its extents inline is freed
    /// within the running transaction, so one not on the list (unlinked
    /// and freed at once) is not put there and taken off again. An inode
    /// is on the list exactly when it carries the orphan flag.
    pub fn destroy_inode(&mut self, ino: u64) -> Result<()> {
        self.load_inode(ino)?;
        let ip = self.with(ino)?.0;
        let in_steps = matches!(ip.fork, Fork::Tree);
        let listed = ip.d.flags & FLAG_ORPHAN != 0;
        if in_steps && !listed {
            self.orphan_add(ino)?;
        }
        self.drop_cached(ino, 0, u64::MAX)?;
        self.drop_prealloc(ino)?;
        self.truncate_blocks(ino, 0)?;
        let ag = self.meta.geo.inode_ag(ino);
        let (ip, cx) = self.with(ino)?;
        let mut xroot = ip.d.xattr_root;
        ip.xattr_tree(ag).destroy(cx.meta, cx.alloc, &mut xroot)?;
        ip.d.xattr_root = xroot;
        if let Fork::Tree = ip.fork {
            let mut root = ip.d.fork_root;
            ip.tree(ag).destroy(cx.meta, cx.alloc, &mut root)?;
            ip.d.fork_root = 0;
            ip.fork = Fork::Inline(Vec::new());
        }
        ip.d.mode = 0;
        ip.d.nlink = 0;
        ip.d.size = 0;
        ip.d.nblocks = 0;
        ip.d.flags = 0;
        ip.d.xattr_root = 0;
        ip.fork = Fork::Inline(Vec::new());
        // Encode as a plain file so the free slot decodes consistently.
        let mut d = ip.to_disk();
        d.fork = ForkFormat::Extents;
        let (blk, off) = cx.meta.geo.inode_loc(ino);
        let uuid = cx.meta.uuid;
        cx.meta.read_itable(blk)?;
        d.encode(&mut cx.meta.write(blk)[off..off + INODE_SIZE], &uuid);
        cx.alloc.free_inode(cx.meta, ino)?;
        self.inodes.remove(&ino);
        if listed || in_steps {
            self.orphan_remove(ino)?;
        }
        Ok(())
    }

    /// Last reference to an open file description went away.
    pub fn release(&mut self, ino: u64) -> Result<()> {
        let (ip, _) = self.with(ino)?;
        take(&mut ip.open, 1, "inode opens");
        let (open, nlink) = (ip.open, ip.d.nlink);
        if nlink == 0 && self.unused(ino, open) {
            self.check_writable()?;
            self.destroy_inode(ino)?;
        }
        Ok(())
    }

    /// Destroy `ino` if it has no name and nothing keeps it (no open, no
    /// hold); one already gone is fine.
    pub fn destroy_if_unkept(&mut self, ino: u64) -> Result<()> {
        let (open, nlink) = match self.with(ino) {
            Ok((ip, _)) => (ip.open, ip.d.nlink),
            Err(Error::NotFound) => return Ok(()),
            Err(e) => return Err(e),
        };
        if nlink == 0 && self.unused(ino, open) {
            self.destroy_inode(ino)?;
        }
        Ok(())
    }

    /// An inode on the orphan list that must not be freed: one with links,
    /// or a directory with entries (rmdir takes only an empty one, and
    /// freeing it would lose its tree). The list is damaged (a name takes
    /// an inode off it in the same transaction): it leaves the list and
    /// loses its orphan flag, for fsck to report.
    fn unlist_kept(&mut self, ino: u64) -> Result<()> {
        let (ip, mut cx) = self.with(ino)?;
        log::warn!(
            "inode {ino} is on the orphan list but has {} links{}: taken off the list, not freed",
            ip.d.nlink,
            if ip.d.nlink == 0 { " and entries" } else { "" }
        );
        ip.d.flags &= !FLAG_ORPHAN;
        ip.store(&mut cx)?;
        self.orphan_remove(ino)
    }

    /// Whether orphan `ino` (loaded) has links, or is a directory with
    /// entries.
    fn kept(&mut self, ino: u64) -> Result<bool> {
        let (ip, mut cx) = self.with(ino)?;
        Ok(ip.d.nlink > 0 || (ip.kind() == FileType::Dir && !ip.dir_is_empty(&mut cx)?))
    }

    /// Finish inodes that were unlinked while open when the system stopped.
    pub fn process_orphans(&mut self) -> Result<()> {
        loop {
            let root = self.orphan_root()?;
            let batch = orphan_tree().scan(&mut self.meta, root, 0, 64)?;
            if batch.is_empty() {
                return Ok(());
            }
            for (ino, _) in batch {
                match self.load_inode(ino) {
                    Ok(()) if self.kept(ino)? => self.unlist_kept(ino)?,
                    Ok(()) => self.destroy_inode(ino)?,
                    Err(Error::NotFound) => self.orphan_remove(ino)?,
                    Err(e) => return Err(e),
                }
                self.maybe_commit()?;
            }
        }
    }
}

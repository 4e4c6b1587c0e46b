//! In-memory inodes: loading, storing, allocating, freeing, orphans.
//!
//! `Inode::d` mirrors the on-disk inode; `d.size` is the size on disk,
//! which only ever covers data already on the device, while `size` is the
//! size the application sees (it runs ahead while dirty data is cached).

use super::folio::Cache;
use super::types::FileType;
use crate::books::take;
use crate::btree::Tree;
use crate::error::{Error, Result};
use crate::format::ag_header::AgHeader;
use crate::format::btree_node::TreeType;
pub(crate) use crate::format::inode::{inline_len, Fork};
use crate::format::inode::{
    DiskInode, ForkFormat, FLAG_APPEND, FLAG_DIRSYNC, FLAG_IMMUTABLE, FLAG_NOATIME, FLAG_NODUMP,
    FLAG_ORPHAN, FLAG_SYNC, INODE_SIZE, LITERAL_SIZE,
};
use crate::format::magic;
use crate::fs::state::{Ctx, Inner};
use crate::fs::types::{FL_APPEND, FL_DIRSYNC, FL_IMMUTABLE, FL_NOATIME, FL_NODUMP, FL_SYNC};

/// Inodes kept in memory before loading another lets go of the unused
/// ones (closed, clean, holding nothing).
pub(crate) const INODES_KEPT: usize = 65536;

/// On-disk flag bits and the API's `FL_*` values for the user's flags.
const USER_FLAGS: [(u32, u32); 6] = [
    (FLAG_IMMUTABLE, FL_IMMUTABLE),
    (FLAG_APPEND, FL_APPEND),
    (FLAG_NODUMP, FL_NODUMP),
    (FLAG_NOATIME, FL_NOATIME),
    (FLAG_SYNC, FL_SYNC),
    (FLAG_DIRSYNC, FL_DIRSYNC),
];

pub(crate) struct Inode {
    pub d: DiskInode,
    pub size: u64,
    pub fork: Fork,
    /// The page cache of this file.
    pub cache: Cache,
    /// Blocks reserved for delayed allocation: exactly the dirty cached
    /// blocks that are not mapped yet.
    pub delalloc: u64,
    /// Readahead: where a sequential reader goes next, and its window.
    pub ra_next: u64,
    pub ra_blocks: u64,
    /// Open file descriptions and direct I/Os in flight: the inode is
    /// not freed while this is non-zero.
    pub open: u32,
    /// Bumped whenever data on the device may change under a reader
    /// (direct writes start or finish, writeback): a reader that sees a
    /// checksum mismatch retries if it moved.
    pub data_gen: u64,
    /// Direct writes in flight (see `dio`).
    pub dio_inflight: Vec<DioWrite>,
    /// Speculative preallocation: file blocks [a, b) past (or, as appends
    /// catch up, just inside) EOF, reserved but not mapped. Dirty blocks
    /// in it hold its reservation, not one of their own.
    pub prealloc: Option<(u64, u64)>,
    /// File blocks [a, b) known to be mapped (written or unwritten), so a
    /// write into them needs no mapping lookup. Cleared when blocks are
    /// unmapped.
    pub map_hint: (u64, u64),
    /// Bumped whenever blocks are mapped or unmapped: a lookup made
    /// before the metadata lock was let go is stale if it moved.
    pub map_gen: u64,
    /// Writeback allocated blocks past EOF (trimmed on close).
    pub spec_eof: bool,
    /// A writeback of this inode is in flight (see `writeback`).
    pub wb_busy: bool,
    /// When the inode went from clean to dirty; Some while it is on its
    /// AG's dirty list.
    pub dirtied_at: Option<std::time::Instant>,
    /// Where the last write ended, and the bytes that sequential writes
    /// ending there have dirtied since writeback last took any (write-
    /// behind).
    pub stream_end: u64,
    pub stream_dirty: u64,
    /// On its AG's write-behind queue.
    pub behind_queued: bool,
    /// Writeback errors so far, and how many `fsync(ino)` has reported
    /// (open file descriptions keep their own count).
    pub wb_errors: u64,
    pub wb_errors_seen: u64,
    /// The transaction that last changed what a reader needs to reach
    /// the data (mapping, size, the inode itself): fdatasync commits the
    /// journal only while that one is not durable.
    pub datasync_seq: u64,
    /// Made by `tmpfile` and not linked yet: `link` may give it its
    /// first name (the kernel's I_LINKABLE).
    pub linkable: bool,
}

/// A direct write in flight over file blocks [from, to).
pub(crate) struct DioWrite {
    pub id: u64,
    pub from: u64,
    pub to: u64,
    /// Another direct write overlapped it while it was in flight: which
    /// data reached the device is unknown, so it records no checksum.
    pub tainted: bool,
}

/// Bytes an inline entry takes in the literal area.
impl Inode {
    pub(crate) fn from_disk(d: DiskInode, blk: u64) -> Result<Self> {
        let fork = d.decode_fork(blk)?;
        Ok(Inode::new(d, fork))
    }

    /// An in-memory inode with nothing cached, open or in flight.
    fn new(d: DiskInode, fork: Fork) -> Inode {
        Inode {
            size: d.size,
            d,
            fork,
            cache: Cache::default(),
            delalloc: 0,
            ra_next: 0,
            ra_blocks: 0,
            open: 0,
            data_gen: 0,
            dio_inflight: Vec::new(),
            prealloc: None,
            map_hint: (0, 0),
            map_gen: 0,
            spec_eof: false,
            wb_busy: false,
            dirtied_at: None,
            stream_end: 0,
            stream_dirty: 0,
            behind_queued: false,
            wb_errors: 0,
            wb_errors_seen: 0,
            datasync_seq: 0,
            linkable: false,
        }
    }

    pub fn to_disk(&self) -> DiskInode {
        let mut d = self.d.clone();
        d.literal = [0; LITERAL_SIZE];
        match &self.fork {
            Fork::Inline(entries) => {
                d.set_inline(entries);
                d.fork = if self.is_dir() {
                    ForkFormat::DirInline
                } else {
                    ForkFormat::Extents
                };
            }
            Fork::Tree => {
                d.fork_count = 0;
                d.fork = if self.is_dir() {
                    ForkFormat::DirTree
                } else {
                    ForkFormat::ExtentTree
                };
            }
            Fork::Symlink(t) => {
                d.literal[..t.len()].copy_from_slice(t);
                d.fork_count = t.len() as u16;
                d.fork = ForkFormat::Symlink;
            }
        }
        d
    }

    /// The user's flags (chattr) in the API's `FL_*` values.
    pub fn user_flags(&self) -> u32 {
        USER_FLAGS
            .iter()
            .filter(|(disk, _)| self.d.flags & disk != 0)
            .fold(0, |acc, (_, fl)| acc | fl)
    }

    /// Set the user's flags from `FL_*` values (others must be checked
    /// away by the caller).
    pub fn set_user_flags(&mut self, flags: u32) {
        for (disk, fl) in USER_FLAGS {
            if flags & fl != 0 {
                self.d.flags |= disk;
            } else {
                self.d.flags &= !disk;
            }
        }
    }

    /// `NotPermitted` when the inode is immutable (chattr +i: nothing
    /// about it may change), or append-only (chattr +a) unless
    /// `append_ok`.
    pub fn check_unfrozen(&self, append_ok: bool) -> Result<()> {
        if self.d.flags & FLAG_IMMUTABLE != 0 {
            return Err(Error::NotPermitted("the inode is immutable"));
        }
        if self.d.flags & FLAG_APPEND != 0 && !append_ok {
            return Err(Error::NotPermitted("the inode is append-only"));
        }
        Ok(())
    }

    /// chattr +S: the file's changes are durable when the call returns.
    pub fn sync_updates(&self) -> bool {
        self.d.flags & FLAG_SYNC != 0
    }

    /// chattr +S or +D on a directory: changes to its entries are
    /// durable when the call returns.
    fn sync_entries(&self) -> bool {
        self.d.flags & (FLAG_SYNC | FLAG_DIRSYNC) != 0
    }

    /// A change to this directory's entries: synchronous if the
    /// directory or the mount says so.
    pub fn entries_changed(&self, cx: &mut Ctx) {
        if self.sync_entries() || cx.meta.sync_dirs {
            cx.meta.sync_wanted = true;
        }
    }

    /// chattr +A: reads leave atime alone.
    pub fn no_atime(&self) -> bool {
        self.d.flags & FLAG_NOATIME != 0
    }

    pub fn kind(&self) -> FileType {
        FileType::from_mode(self.d.mode).unwrap_or(FileType::File)
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == FileType::Dir
    }

    /// The tree that holds this inode's fork when it is not inline.
    pub fn tree(&self, ag: u32) -> Tree {
        Tree {
            owner: self.d.ino,
            tt: if self.is_dir() {
                TreeType::Dir
            } else {
                TreeType::Extents
            },
            ag,
        }
    }

    pub fn xattr_tree(&self, ag: u32) -> Tree {
        Tree {
            owner: self.d.ino,
            tt: TreeType::Xattr,
            ag,
        }
    }

    /// Write the inode into its inode-table block (joins the transaction).
    pub fn store(&mut self, cx: &mut Ctx) -> Result<()> {
        self.datasync_seq = cx.meta.running_seq();
        if self.sync_updates() {
            cx.meta.sync_wanted = true;
        }
        self.store_times(cx)
    }

    /// `store` for a change fdatasync need not wait for: timestamps, and
    /// checksums of overwritten blocks whose "no checksum" intent is
    /// already durable.
    /// An inode whose record is unchanged (a write within the same clock
    /// tick as the last) is not written again, so the block stays out of
    /// the transaction.
    pub fn store_times(&self, cx: &mut Ctx) -> Result<()> {
        let (blk, off) = cx.meta.geo.inode_loc(self.d.ino);
        let uuid = cx.meta.uuid;
        let mut rec = [0u8; INODE_SIZE];
        self.to_disk().encode(&mut rec, &uuid);
        if cx.meta.read_itable(blk)?[off..off + INODE_SIZE] == rec {
            return Ok(());
        }
        cx.meta.write(blk)[off..off + INODE_SIZE].copy_from_slice(&rec);
        Ok(())
    }

    pub fn touch_ctime(&mut self) {
        self.d.ctime = crate::fs::state::now();
    }

    pub fn touch_mtime(&mut self) {
        let mut t = crate::fs::state::now();
        // Not behind a finer stamp of this same tick (a rename or chmod
        // just before).
        let c = self.d.ctime;
        if (c.sec, c.nsec) > (t.sec, t.nsec) && c.sec <= t.sec + 1 {
            t = c;
        }
        self.d.mtime = t;
        self.d.ctime = t;
    }
}

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
        let t = crate::fs::state::now();
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
        let is_dir = mode & super::types::S_IFMT == 0o040000;
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

//! In-memory inodes: their fields, flags, trees and storing them
//! (loading, allocating, freeing and orphans: `itable`).
//!
//! `Inode::d` mirrors the on-disk inode; `d.size` is the size on disk,
//! which only ever covers data already on the device, while `size` is the
//! size the application sees (it runs ahead while dirty data is cached).

use super::data::folio::Cache;
use super::types::FileType;
use crate::btree::Tree;
use crate::error::{Error, Result};
use crate::format::btree_node::TreeType;
pub(crate) use crate::format::inode::{inline_len, Fork};
use crate::format::inode::{
    DiskInode, ForkFormat, FLAG_APPEND, FLAG_DIRSYNC, FLAG_IMMUTABLE, FLAG_NOATIME, FLAG_NODUMP,
    FLAG_SYNC, INODE_SIZE, LITERAL_SIZE,
};
use crate::fs::ctx::Ctx;
use crate::fs::types::{FL_APPEND, FL_DIRSYNC, FL_IMMUTABLE, FL_NOATIME, FL_NODUMP, FL_SYNC};

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
    /// Where the last direct read ended, and the next ones read ahead,
    /// in order (`data/ahead.rs`).
    pub dio_next: Option<u64>,
    pub dio_ahead: Vec<std::sync::Arc<crate::fs::data::ahead_slot::Ahead>>,
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
    /// The furthest a stream of writes has reached (each starting within
    /// `STREAM_SLACK` of it), and the bytes its writes have dirtied since
    /// writeback last took any (write-behind).
    pub stream_end: u64,
    pub stream_dirty: u64,
    /// The block past the highest one writeback has taken since the
    /// stream started: write-behind looks above it for blocks the
    /// stream's writes have yet to fill.
    pub stream_taken: u64,
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
    pub(super) fn new(d: DiskInode, fork: Fork) -> Inode {
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
            dio_next: None,
            dio_ahead: Vec::new(),
            prealloc: None,
            map_hint: (0, 0),
            map_gen: 0,
            spec_eof: false,
            wb_busy: false,
            dirtied_at: None,
            stream_end: 0,
            stream_dirty: 0,
            stream_taken: 0,
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
        self.d.ctime = crate::fs::clock::now();
    }

    pub fn touch_mtime(&mut self) {
        let mut t = crate::fs::clock::now();
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

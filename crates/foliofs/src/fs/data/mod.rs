//! The buffered data path: dirty blocks live in each inode's folio cache
//! (`folio`) and are written back by the writeback contexts, fsync, sync,
//! memory pressure and unmount (`writeback`).
//!
//! The verbs, a file each:
//! - `folio`: technique 1, the per-block state of a folio (uptodate, dirty);
//! - `pagecache`: finding and making folios, the memory pool, eviction;
//! - `read`: buffered reads (fill a folio from the device, verify, copy);
//! - `verify`: the checked device read every data read goes through
//!   (checksums and logged images taken under the lock, read and
//!   verified without it);
//! - `write`: buffered writes, one step per folio (the driver is
//!   `Fs::write`, which drops the metadata lock for large copies);
//! - `delalloc`: technique 5, reservation, post-EOF speculative
//!   preallocation, its growth, trimming and release, allocation of
//!   delayed ranges;
//! - `size`: truncate, fallocate, zeroing, seek data/hole, extent listing;
//! - `writeback`: prepare / submit / complete, fsync and sync;
//! - `contexts`: technique 4, the per-AG writeback contexts, write-behind
//!   and dirty throttling;
//! - `dio` with `iolock`: techniques 2 and 3, checksummed direct I/O with
//!   large requests and the shared inode lock for overwrites; `ahead`
//!   (its records in `ahead_slot`), read-ahead for sequential direct
//!   readers;
//! - `overwrite`: overwrites of written blocks, logged with their
//!   checksums (small) or written out of place (large).
//!
//! write, one step per folio: find or make the folio (fresh memory mapped
//!        without the metadata lock) -> wait while it is under writeback
//!        (stable pages) -> reserve space for holes -> read or zero partial
//!        blocks -> mark the blocks dirty and pin the folio -> copy (large
//!        steps without the metadata lock) -> unpin
//! writeback: classify dirty blocks -> log small overwrites, take new
//!        blocks for large ones -> allocate holes as unwritten extents ->
//!        write merged device runs from the folios -> record checksums,
//!        remap out-of-place runs, convert to written, publish the size
//!
//! Ordering rules that make crashes safe:
//! - newly allocated blocks are mapped unwritten until their data is on the
//!   device, so a crash never exposes what was there before;
//! - an overwrite never writes a home block before its new image and
//!   checksum are durable in the journal (logged), or never writes the
//!   old blocks at all (out of place), so a written block's checksum
//!   always matches it after a crash;
//! - the on-disk size only covers data already on the device.

pub(super) mod ahead;
pub(super) mod ahead_slot;
pub(super) mod contexts;
mod delalloc;
pub(super) mod dio;
pub(super) mod folio;
pub(super) mod iolock;
pub(super) mod overwrite;
mod pagecache;
pub(in crate::fs) mod read;
mod size;
mod verify;
pub(super) mod write;
pub(super) mod writeback;

/// Largest file offset: keeps block arithmetic far from overflow.
pub const MAX_FILE_SIZE: u64 = 1 << 50;

/// Largest device I/O writeback and reads issue (1 MiB at 4 KiB blocks).
pub(in crate::fs) const MAX_IO_BLOCKS: u64 = 256;

//! Overwrites of written blocks, checksummed at the price of one flush.
//!
//! small (a contiguous run shorter than `log_max_blocks`): logged. The new
//!     images and their checksums join the running transaction (`Meta::
//!     write_data`); the commit writes them to the journal with the
//!     metadata (a checksum block already imaged in the live log is left
//!     out: replay derives the checksums from the images), one write and
//!     one flush for every writer in the group; a
//!     checkpoint writes them home later, in sorted runs. Until then
//!     readers take them from the log's memory (`Meta::logged_range`).
//! large: out of place. New blocks are taken in memory only
//!     (`Alloc::alloc_in_memory`), the data is written there, and one
//!     transaction records the allocation, maps the new blocks in place of
//!     the old, sets their checksums and frees the old ones (`cow_remap`).
//!
//! Invariants: a written block's stored checksum always matches what its
//! home holds or what replay will put there (the logged image, committed
//! with the checksum); no state leaves a written block without a
//! checksum. A home location is written only by a checkpoint, after the
//! transaction holding its image is durable; a block with a logged image
//! in the live journal is not reused before the checkpoint that retires
//! the image (`Meta::finish`). A crash before an out-of-place overwrite's
//! transaction leaves the old mapping and the new blocks free.
//!
//! `MountOptions::overwrite_log = false` keeps the scheme before this one
//! (a "no checksum" intent committed before an in-place write) for the
//! A/B benchmark.

use crate::csums::set_csums;
use crate::error::{Error, Result};
use crate::fs::bump;
use crate::fs::ctx::Ctx;
use crate::fs::fork::Extent;
use crate::fs::inode::Inode;
use crate::fs::state::Inner;

/// Part of an out-of-place overwrite: file blocks [lblk, lblk + len) move
/// to new device blocks from `pblk`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cow {
    pub lblk: u64,
    pub pblk: u64,
    pub len: u64,
}

impl Inner {
    /// Contiguous overwrites shorter than this many blocks are logged,
    /// longer ones written out of place; 0 with the overwrite log off.
    pub(in crate::fs) fn log_max_blocks(&self) -> u64 {
        if !self.opts.overwrite_log {
            return 0;
        }
        let bs = self.meta.geo.block_size;
        // A transaction must fit the log with room to spare.
        (self.opts.overwrite_log_max / bs)
            .min(self.meta.geo.journal_blocks / 16)
            .max(1)
    }
}

/// New blocks for an out-of-place overwrite of file blocks
/// [lblk, lblk + n), taken in memory (near `goal`, in AG `ag`). None when
/// the space is not there: the caller logs the overwrite instead.
pub(in crate::fs) fn cow_alloc(
    cx: &mut Ctx,
    ag: u32,
    goal: Option<u64>,
    lblk: u64,
    n: u64,
) -> Result<Option<Vec<Cow>>> {
    match cx.reserve(n) {
        Err(Error::NoSpace) => return Ok(None),
        r => r?,
    }
    let mut out: Vec<Cow> = Vec::new();
    let mut l = lblk;
    while l < lblk + n {
        let goal = out.last().map(|c| c.pblk + c.len).or(goal);
        match cx.alloc.alloc_in_memory(cx.meta, ag, goal, lblk + n - l) {
            Ok((p, k)) => {
                out.push(Cow {
                    lblk: l,
                    pblk: p,
                    len: k,
                });
                l += k;
            }
            Err(e) => {
                cx.alloc.unreserve(n);
                unalloc(cx, &out);
                return match e {
                    Error::NoSpace => Ok(None),
                    e => Err(e),
                };
            }
        }
    }
    // Taken from the free space now; the old blocks come back when the
    // remap's transaction commits.
    cx.alloc.unreserve(n);
    Ok(Some(out))
}

/// Give back the blocks of out-of-place overwrites that did not happen.
pub(in crate::fs) fn unalloc(cx: &mut Ctx, cows: &[Cow]) {
    let geo = cx.meta.geo.clone();
    for c in cows {
        cx.alloc.unalloc(&geo, c.pblk, c.len);
    }
}

impl Inode {
    /// Log new contents for this file's written device blocks from `pblk`
    /// (`data` in whole blocks): images and checksums join the running
    /// transaction (committed first when it already holds a large share
    /// of the log), and fdatasync of the file waits for that transaction.
    pub(in crate::fs) fn log_overwrite(
        &mut self,
        cx: &mut Ctx,
        pblk: u64,
        data: &[u8],
    ) -> Result<()> {
        let bs = cx.meta.geo.block_size as usize;
        let n = data.len() / bs;
        if cx.meta.running_data_blocks() + n > (cx.meta.geo.journal_blocks / 8) as usize {
            cx.meta.commit()?;
        }
        for (k, b) in data.chunks(bs).enumerate() {
            cx.meta.write_data(pblk + k as u64, b)?;
        }
        self.datasync_seq = cx.meta.running_seq();
        bump(&cx.counters.overwrite_logged_bytes, data.len() as u64);
        Ok(())
    }

    /// The data of `cows` is on the device: record their allocation, map
    /// them in place of the old blocks (freed) and set their checksums
    /// (`crcs`, one per block of `cows` in order), all in the running
    /// transaction.
    pub(in crate::fs) fn cow_remap(
        &mut self,
        cx: &mut Ctx,
        cows: &[Cow],
        crcs: &[u32],
    ) -> Result<()> {
        let bs = cx.meta.geo.block_size;
        let mut i = 0;
        for c in cows {
            cx.alloc.commit_alloc(cx.meta, c.pblk, c.len)?;
            for (p, n) in self.ext_remove(cx, c.lblk, c.lblk + c.len)? {
                cx.alloc.free(cx.meta, p, n)?;
            }
            self.ext_insert(
                cx,
                Extent {
                    lblk: c.lblk,
                    pblk: c.pblk,
                    len: c.len,
                    unwritten: false,
                },
            )?;
            set_csums(cx.meta, c.pblk, &crcs[i..i + c.len as usize])?;
            i += c.len as usize;
            bump(&cx.counters.overwrite_cow_bytes, c.len * bs);
        }
        self.store(cx)
    }
}

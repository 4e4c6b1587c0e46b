//! Checked device reads: the one place data blocks come off the device
//! and are held against their checksums. A read takes what checking
//! needs under the metadata lock (`DeviceRuns::push`: each run's
//! checksums, and the images of its blocks whose newest data is still
//! in the overwrite log) and reads and verifies without it
//! (`DeviceRuns::read`). Buffered fills, direct reads and the
//! single-block read of a partial write all go through it.

use crate::csums::get_csums;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::data_crc;
use crate::meta::Meta;
use std::cell::Cell;

/// One device run: `count` blocks from file block `lblk`, at device
/// block `pblk`.
#[derive(Clone, Copy, Debug)]
pub(in crate::fs) struct DevRun {
    pub lblk: u64,
    pub pblk: u64,
    pub count: u64,
}

/// Device runs to read and verify, with their checksums and logged
/// images. Its vectors are this thread's, kept from one read to the next
/// (`take`, and `Drop` gives them back), so a read allocates nothing.
pub(in crate::fs) struct DeviceRuns {
    runs: Vec<DevRun>,
    /// One per block of the runs, in order (0: none stored).
    crcs: Vec<u32>,
    /// (file block, image), in file order: the overwrite log has these
    /// blocks' newest data (rare: small overwrites not yet home).
    logged: Vec<(u64, Box<[u8]>)>,
}

thread_local! {
    /// This thread's run and checksum vectors between reads.
    static SPARE: Cell<(Vec<DevRun>, Vec<u32>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

impl DeviceRuns {
    /// An empty set, on this thread's kept vectors.
    pub fn take() -> DeviceRuns {
        let (mut runs, mut crcs) = SPARE.try_with(|s| s.take()).unwrap_or_default();
        runs.clear();
        crcs.clear();
        DeviceRuns {
            runs,
            crcs,
            logged: Vec::new(),
        }
    }

    /// Add the run of `count` blocks from file block `lblk` at device
    /// block `pblk`, taking its checksums and logged images from `meta`
    /// (under the metadata lock). Runs are pushed in file order.
    pub fn push(&mut self, meta: &mut Meta, lblk: u64, pblk: u64, count: u64) -> Result<()> {
        debug_assert!(self.runs.last().is_none_or(|r| r.lblk + r.count <= lblk));
        get_csums(meta, pblk, count, &mut self.crcs)?;
        self.logged.extend(
            meta.logged_range(pblk, count)
                .map(|(b, img)| (lblk + (b - pblk), img.into())),
        );
        self.runs.push(DevRun { lblk, pblk, count });
        Ok(())
    }

    pub fn runs(&self) -> &[DevRun] {
        &self.runs
    }

    /// Read each run into `buf` at byte `at(run)` (no lock held), lay
    /// the logged images over it and verify every block. The first block
    /// whose checksum does not match is an error naming it (file offset
    /// of `ino`, device block).
    pub fn read(
        &self,
        ino: u64,
        bs: u64,
        dev: &dyn Device,
        buf: &mut [u8],
        at: impl Fn(&DevRun) -> usize,
    ) -> Result<()> {
        self.fetch(bs, dev, buf, &at)?;
        self.verify(ino, bs, buf, &at)
    }

    /// `read`'s first half: the device reads, with the logged images
    /// laid over them.
    pub fn fetch(
        &self,
        bs: u64,
        dev: &dyn Device,
        buf: &mut [u8],
        at: &impl Fn(&DevRun) -> usize,
    ) -> Result<()> {
        let b = bs as usize;
        let mut logged = self.logged.iter().peekable();
        for r in &self.runs {
            let from = at(r);
            let out = &mut buf[from..from + r.count as usize * b];
            dev.read_at(out, r.pblk * bs)?;
            while let Some((l, img)) = logged.next_if(|(l, _)| *l < r.lblk + r.count) {
                let i = (l - r.lblk) as usize * b;
                out[i..i + b].copy_from_slice(img);
            }
        }
        Ok(())
    }

    /// `read`'s second half: every block against its checksum.
    pub fn verify(
        &self,
        ino: u64,
        bs: u64,
        buf: &[u8],
        at: &impl Fn(&DevRun) -> usize,
    ) -> Result<()> {
        let b = bs as usize;
        let mut crcs = self.crcs.as_slice();
        for r in &self.runs {
            let from = at(r);
            let out = &buf[from..from + r.count as usize * b];
            let (mine, rest) = crcs.split_at(r.count as usize);
            crcs = rest;
            let bad = out
                .chunks(b)
                .zip(mine)
                .position(|(blk, &stored)| stored != 0 && data_crc(blk) != stored);
            if let Some(k) = bad {
                return Err(Error::DataChecksum {
                    ino,
                    offset: (r.lblk + k as u64) * bs,
                    addr: r.pblk + k as u64,
                });
            }
        }
        Ok(())
    }
}

impl Drop for DeviceRuns {
    fn drop(&mut self) {
        // Kept unless they grew past a large direct read's.
        if self.crcs.capacity() <= 1 << 16 {
            let v = (
                std::mem::take(&mut self.runs),
                std::mem::take(&mut self.crcs),
            );
            let _ = SPARE.try_with(|s| s.set(v));
        }
    }
}

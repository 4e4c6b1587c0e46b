//! `Ctx`, what the engine's parts borrow together from behind the
//! metadata lock: the metadata cache and journal, the allocator and the
//! counters. An inode's methods take one beside the inode itself.

use super::counters::Counters;
use crate::alloc::Alloc;
use crate::error::{Error, Result};
use crate::meta::Meta;

/// What the engine's parts borrow together: metadata cache/journal,
/// allocator and counters.
pub(crate) struct Ctx<'a> {
    pub meta: &'a mut Meta,
    pub alloc: &'a mut Alloc,
    pub counters: &'a Counters,
}

impl Ctx<'_> {
    /// Allocate, making room first if frees are only waiting for a checkpoint.
    pub fn alloc(&mut self, ag: u32, goal: Option<u64>, want: u64) -> Result<(u64, u64)> {
        match self.alloc.alloc(self.meta, ag, goal, want) {
            Err(Error::NoSpace) if self.reclaimable() => {
                self.reclaim()?;
                self.alloc.alloc(self.meta, ag, goal, want)
            }
            r => r,
        }
    }

    pub fn reclaimable(&self) -> bool {
        !self.meta.freed_running.is_empty() || !self.meta.freed_committed.is_empty()
    }

    /// Commit and checkpoint so that freed blocks become reusable.
    pub fn reclaim(&mut self) -> Result<()> {
        self.meta.commit()?;
        self.meta.checkpoint()?;
        self.alloc.take_freed(self.meta);
        Ok(())
    }

    /// Reserve blocks for dirty data, reclaiming first if that helps.
    pub fn reserve(&mut self, n: u64) -> Result<()> {
        self.reserve_from(n, false)
    }

    /// Before a change that may take metadata blocks (a name, a
    /// symlink's target, an xattr block): ENOSPC, before anything
    /// changes, unless more than half of the blocks kept for metadata
    /// are free, reclaiming first if that helps. The other half is for
    /// what must not fail: writeback's extent and checksum records for
    /// data already reserved, and removals. One change takes a few blocks
    /// at most (a split per tree level), so one that starts never runs
    /// out half way (a rename did: its old name went, and the new one
    /// found no block).
    pub fn meta_room(&mut self) -> Result<()> {
        self.alloc.take_freed(self.meta);
        if !self.alloc.meta_room() && self.reclaimable() {
            self.reclaim()?;
        }
        match self.alloc.meta_room() {
            true => Ok(()),
            false => Err(Error::NoSpace),
        }
    }

    /// `reserve` for a write from a client's cache (`Alloc::reserve_cached`).
    pub fn reserve_cached(&mut self, n: u64) -> Result<()> {
        self.reserve_from(n, true)
    }

    fn reserve_from(&mut self, n: u64, cached: bool) -> Result<()> {
        let try_once = |a: &mut Alloc| {
            if cached {
                a.reserve_cached(n)
            } else {
                a.reserve(n)
            }
        };
        self.alloc.take_freed(self.meta);
        match try_once(self.alloc) {
            Err(Error::NoSpace) if self.reclaimable() => {
                self.reclaim()?;
                try_once(self.alloc)
            }
            r => r,
        }
    }
}

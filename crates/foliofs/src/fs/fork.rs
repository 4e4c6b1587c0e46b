//! The data fork as an ordered key/value map, inline in the inode until it
//! outgrows the literal area, then a B+tree; and the extent map on top.
//!
//! The extent encoding is `format::extent`.

use super::bump;
use super::inode::{inline_len, Fork, Inode};
use crate::error::{Error, Result};
use crate::format::inode::LITERAL_SIZE;
use crate::fs::ctx::Ctx;

pub use crate::format::extent::{Extent, MAX_EXTENT_LEN};

impl Inode {
    fn ag(&self, cx: &Ctx) -> u32 {
        cx.meta.geo.inode_ag(self.d.ino)
    }

    /// The entry with the largest key <= `key`.
    pub fn kv_le(&self, cx: &mut Ctx, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
        match &self.fork {
            Fork::Inline(v) => {
                let i = v.partition_point(|(k, _)| *k <= key);
                Ok((i > 0).then(|| v[i - 1].clone()))
            }
            Fork::Tree => self
                .tree(self.ag(cx))
                .find_le(cx.meta, self.d.fork_root, key),
            Fork::Symlink(_) => Ok(None),
        }
    }

    /// The first `max` entries with keys >= `key` (fewer at the end).
    pub fn kv_scan(&self, cx: &mut Ctx, key: u64, max: usize) -> Result<Vec<(u64, Vec<u8>)>> {
        self.kv_range(cx, key, u64::MAX, max)
    }

    /// The first `max` entries with keys in [lo, hi].
    pub fn kv_range(
        &self,
        cx: &mut Ctx,
        lo: u64,
        hi: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        match &self.fork {
            Fork::Inline(v) => Ok(v
                .iter()
                .filter(|(k, _)| (lo..=hi).contains(k))
                .take(max)
                .cloned()
                .collect()),
            Fork::Tree => self
                .tree(self.ag(cx))
                .scan_range(cx.meta, self.d.fork_root, lo, hi, max),
            Fork::Symlink(_) => Ok(Vec::new()),
        }
    }

    pub fn kv_put(&mut self, cx: &mut Ctx, key: u64, value: &[u8]) -> Result<()> {
        let ag = self.ag(cx);
        self.datasync_seq = cx.meta.running_seq();
        match &mut self.fork {
            Fork::Inline(v) => {
                match v.binary_search_by_key(&key, |(k, _)| *k) {
                    Ok(i) => v[i].1 = value.to_vec(),
                    Err(i) => v.insert(i, (key, value.to_vec())),
                }
                if inline_len(v) > LITERAL_SIZE {
                    // Outgrew the inode: move every entry into a new tree.
                    let entries = std::mem::take(v);
                    let tree = self.tree(ag);
                    let mut root = 0;
                    for (k, val) in &entries {
                        tree.insert(cx.meta, cx.alloc, &mut root, *k, val)?;
                    }
                    self.d.fork_root = root;
                    self.fork = Fork::Tree;
                }
                Ok(())
            }
            Fork::Tree => {
                let mut root = self.d.fork_root;
                self.tree(ag)
                    .insert(cx.meta, cx.alloc, &mut root, key, value)?;
                self.d.fork_root = root;
                Ok(())
            }
            Fork::Symlink(_) => Err(Error::Invalid("symlink has no data fork".into())),
        }
    }

    pub fn kv_del(&mut self, cx: &mut Ctx, key: u64) -> Result<Option<Vec<u8>>> {
        let ag = self.ag(cx);
        self.datasync_seq = cx.meta.running_seq();
        match &mut self.fork {
            Fork::Inline(v) => Ok(v
                .binary_search_by_key(&key, |(k, _)| *k)
                .ok()
                .map(|i| v.remove(i).1)),
            Fork::Tree => {
                let mut root = self.d.fork_root;
                let r = self.tree(ag).remove(cx.meta, cx.alloc, &mut root, key)?;
                self.d.fork_root = root;
                if root == 0 {
                    self.fork = Fork::Inline(Vec::new());
                }
                Ok(r)
            }
            Fork::Symlink(_) => Ok(None),
        }
    }

    // ---- extents ----

    /// The extent containing file block `lblk`, if any.
    pub fn ext_find(&self, cx: &mut Ctx, lblk: u64) -> Result<Option<Extent>> {
        bump(&cx.counters.mapping_lookups, 1);
        match self.kv_le(cx, lblk)? {
            Some((k, v)) => {
                let e = cx.meta.geo.extent(self.d.ino, k, &v)?;
                Ok((e.end() > lblk).then_some(e))
            }
            None => Ok(None),
        }
    }

    /// Extents overlapping [from, to), in order.
    pub fn ext_range(&self, cx: &mut Ctx, from: u64, to: u64) -> Result<Vec<Extent>> {
        let mut out = Vec::new();
        self.ext_walk(cx, from, to, |e| {
            out.push(e);
            true
        })?;
        Ok(out)
    }

    /// The first extent overlapping [from, to) that `want` takes, reading
    /// the map a batch at a time up to it (SEEK_DATA in a file of many
    /// extents reads what lies before the data, not the rest of the file).
    pub fn ext_first(
        &self,
        cx: &mut Ctx,
        from: u64,
        to: u64,
        want: impl Fn(&Extent) -> bool,
    ) -> Result<Option<Extent>> {
        let mut found = None;
        self.ext_walk(cx, from, to, |e| {
            if want(&e) {
                found = Some(e);
            }
            found.is_none()
        })?;
        Ok(found)
    }

    /// Hand the extents overlapping [from, to) to `each`, in order, until
    /// it returns false.
    fn ext_walk(
        &self,
        cx: &mut Ctx,
        from: u64,
        to: u64,
        mut each: impl FnMut(Extent) -> bool,
    ) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        if let Some(e) = self.ext_find(cx, from)? {
            if !each(e) {
                return Ok(());
            }
        }
        let mut key = from + 1;
        while key < to {
            let batch = self.kv_range(cx, key, to - 1, 64)?;
            for (k, v) in &batch {
                if !each(cx.meta.geo.extent(self.d.ino, *k, v)?) {
                    return Ok(());
                }
            }
            match batch.last() {
                Some((k, _)) if batch.len() == 64 => key = k + 1,
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// The last `max` extents that end past `first`, in order: found from
    /// the end, one descent each, without reading those before them (a
    /// truncation of a file of many extents takes them a batch at a time).
    pub fn ext_last(&self, cx: &mut Ctx, first: u64, max: usize) -> Result<Vec<Extent>> {
        let mut out = Vec::new();
        let mut key = u64::MAX;
        while out.len() < max {
            let Some((k, v)) = self.kv_le(cx, key)? else {
                break;
            };
            let e = cx.meta.geo.extent(self.d.ino, k, &v)?;
            if e.end() <= first {
                break;
            }
            out.push(e);
            if k <= first {
                break;
            }
            key = k - 1;
        }
        out.reverse();
        Ok(out)
    }

    /// Unmap [from, to); returns the device runs that were mapped there
    /// (the caller frees them).
    pub fn ext_remove(&mut self, cx: &mut Ctx, from: u64, to: u64) -> Result<Vec<(u64, u64)>> {
        self.map_hint = (0, 0);
        self.map_gen += 1;
        let mut freed = Vec::new();
        for e in self.ext_range(cx, from, to)? {
            self.kv_del(cx, e.lblk)?;
            if e.lblk < from {
                let left = Extent {
                    len: from - e.lblk,
                    ..e
                };
                self.kv_put(cx, left.lblk, &left.value())?;
            }
            if e.end() > to {
                let skip = to - e.lblk;
                let right = Extent {
                    lblk: to,
                    pblk: e.pblk + skip,
                    len: e.end() - to,
                    unwritten: e.unwritten,
                };
                self.kv_put(cx, right.lblk, &right.value())?;
            }
            let s = from.max(e.lblk);
            let t = to.min(e.end());
            freed.push((e.pblk + (s - e.lblk), t - s));
        }
        Ok(freed)
    }

    /// Map a range that is currently unmapped, merging with neighbours
    /// that continue it on the device with the same state.
    pub fn ext_insert(&mut self, cx: &mut Ctx, mut e: Extent) -> Result<()> {
        self.map_gen += 1;
        if e.lblk > 0 {
            if let Some(l) = self.ext_find(cx, e.lblk - 1)? {
                if l.end() == e.lblk
                    && l.pblk + l.len == e.pblk
                    && l.unwritten == e.unwritten
                    && l.len + e.len <= MAX_EXTENT_LEN
                {
                    self.kv_del(cx, l.lblk)?;
                    e = Extent {
                        lblk: l.lblk,
                        pblk: l.pblk,
                        len: l.len + e.len,
                        unwritten: e.unwritten,
                    };
                }
            }
        }
        if let Some(r) = self.ext_find(cx, e.end())? {
            if r.lblk == e.end()
                && e.pblk + e.len == r.pblk
                && r.unwritten == e.unwritten
                && r.len + e.len <= MAX_EXTENT_LEN
            {
                self.kv_del(cx, r.lblk)?;
                e.len += r.len;
            }
        }
        self.kv_put(cx, e.lblk, &e.value())
    }

    /// Turn unwritten blocks in [from, to) into written ones (after their
    /// data reached the device). Nothing is mapped or unmapped: the
    /// mapping hint and change count stay as they were.
    pub fn ext_mark_written(&mut self, cx: &mut Ctx, from: u64, to: u64) -> Result<()> {
        let (hint, gen) = (self.map_hint, self.map_gen);
        for e in self.ext_range(cx, from, to)? {
            if !e.unwritten {
                continue;
            }
            let s = from.max(e.lblk);
            let t = to.min(e.end());
            self.ext_remove(cx, s, t)?;
            self.ext_insert(
                cx,
                Extent {
                    lblk: s,
                    pblk: e.pblk + (s - e.lblk),
                    len: t - s,
                    unwritten: false,
                },
            )?;
        }
        (self.map_hint, self.map_gen) = (hint, gen);
        Ok(())
    }

    /// Every extent of the file.
    pub fn ext_all(&self, cx: &mut Ctx) -> Result<Vec<Extent>> {
        self.ext_range(cx, 0, u64::MAX)
    }
}

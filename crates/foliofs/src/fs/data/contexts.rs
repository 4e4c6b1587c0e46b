//! Writeback contexts: threads, by default one per AG up to a cap; inode i
//! belongs to context `ag(i) % n`. Each context has its own dirty lists
//! (its AGs' queues, oldest first) and bandwidth estimate, and wakes on the
//! background threshold, on a period (old dirty data, journal commit) and
//! on sync. Writers above the dirty threshold are throttled in proportion
//! to how far over they are (balance_dirty_pages-style) and wait for
//! writeback at the hard limit.
//!
//! Invariants (seeds/parallel-writeback.txt): each inode belongs to
//! exactly one context, chosen by its AG, so delayed allocation still
//! merges a file's dirty ranges into long extents and allocation stays in
//! the AG the context serves; dirty memory is bounded by throttling in
//! proportion, never by an unbounded queue; sync waits on every context,
//! and fsync of one inode is independent of the others.

use super::folio::Cache;
use super::write::STREAM_SLACK;
use super::writeback::BATCH_BYTES;
use crate::fs::state::{Inner, Shared};
use crate::fs::{bump, Fs, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most bytes one pass of a writeback context takes from one inode before
/// moving to the next (fairness between files).
const PASS_BYTES: u64 = 16 << 20;
/// A file with at most this much cached goes with others due at the same
/// time (`writeback_many`): small files cost a few large device writes.
const SMALL_FILE_BYTES: u64 = 256 << 10;
/// Longest a throttled writer sleeps at once.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// Whether an inode dirtied at `at` is due for writeback: over the
/// background threshold, or dirtied before `expired`.
fn due(at: Instant, background: bool, expired: Option<Instant>) -> bool {
    background || expired.is_some_and(|e| at <= e)
}

/// Where write-behind of a stream that has reached block `at` stops:
/// before the folio the writer is filling, and before the first block
/// from `from` on that a write still on its way may fill (writes of a
/// stream arrive out of order, up to `STREAM_SLACK` apart): one not
/// cached, or in a folio not whole.
fn behind_limit(cache: &Cache, from: u64, at: u64) -> u64 {
    // One walk over the folios from the one holding `from` (in order).
    let start = cache.find(from).map_or(from, |(first, _)| first);
    let mut p = from;
    for (&first, f) in cache.folios.range(start..at.max(start)) {
        if first > p {
            return p;
        }
        if !f.all_uptodate() {
            return first;
        }
        p = first + f.nblocks as u64;
    }
    if p < at {
        return p;
    }
    cache.find(at).map_or(at, |(first, _)| first)
}

impl Inner {
    /// Queue the inode on its AG's dirty list if it is not there.
    pub(in crate::fs) fn mark_inode_dirty(&mut self, ino: u64) {
        let ag = self.meta.geo.inode_ag(ino) as usize;
        if let Some(ip) = self.inodes.get_mut(&ino) {
            if ip.dirtied_at.is_none() {
                ip.dirtied_at = Some(Instant::now());
                self.dirty_queues[ag].push_back(ino);
            }
        }
    }

    /// The next inode context `id` of `n` should write back, and the
    /// block below which to write: the oldest on its AGs' lists dirtied
    /// before `expired` (or any, when over the background threshold),
    /// all of it; else one due for write-behind, the whole folios behind
    /// its writer. Clean inodes met on the way leave the lists.
    pub(super) fn pick_dirty(
        &mut self,
        id: usize,
        n: usize,
        background: bool,
        expired: Option<Instant>,
    ) -> Option<(u64, u64)> {
        let mut best: Option<(Instant, usize)> = None;
        for ag in (id..self.dirty_queues.len()).step_by(n) {
            while let Some(&ino) = self.dirty_queues[ag].front() {
                let Some(ip) = self.inodes.get_mut(&ino) else {
                    self.dirty_queues[ag].pop_front();
                    continue;
                };
                if !ip.cache.any_dirty() && ip.size == ip.d.size && !ip.wb_busy {
                    ip.dirtied_at = None;
                    self.dirty_queues[ag].pop_front();
                    continue;
                }
                let at = ip.dirtied_at.unwrap_or_else(Instant::now);
                if !ip.wb_busy && due(at, background, expired) && best.is_none_or(|b| at < b.0) {
                    best = Some((at, ag));
                }
                break;
            }
        }
        if let Some((_, ag)) = best {
            return self.dirty_queues[ag].pop_front().map(|ino| (ino, u64::MAX));
        }
        let bs = self.meta.geo.block_size;
        let threshold = self.opts.write_behind_bytes;
        for ag in (id..self.behind_queues.len()).step_by(n) {
            while let Some(ino) = self.behind_queues[ag].pop_front() {
                let Some(ip) = self.inodes.get_mut(&ino) else {
                    continue;
                };
                ip.behind_queued = false;
                if ip.wb_busy || ip.stream_dirty < threshold {
                    // Its writeback is under way, or took the blocks.
                    continue;
                }
                let at = ip.stream_end / bs;
                let from = ip.stream_end.saturating_sub(STREAM_SLACK).div_ceil(bs);
                let below = behind_limit(&ip.cache, from.max(ip.stream_taken), at);
                return Some((ino, below));
            }
        }
        None
    }

    /// When `first` (picked due, all of it) is a small file: the small
    /// files due with it, from the front of context `id`'s AG lists
    /// (oldest first), up to `BATCH_BYTES` cached in all, for one
    /// `writeback_many`. Empty otherwise.
    pub(super) fn pick_more_due(
        &mut self,
        first: u64,
        id: usize,
        n: usize,
        background: bool,
        expired: Option<Instant>,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        let small = |ip: &crate::fs::inode::Inode| ip.cache.bytes() <= SMALL_FILE_BYTES;
        let Some(mut bytes) = self
            .inodes
            .get(&first)
            .filter(|ip| small(ip))
            .map(|ip| ip.cache.bytes())
        else {
            return out;
        };
        for ag in (id..self.dirty_queues.len()).step_by(n) {
            while bytes < BATCH_BYTES {
                let Some(&ino) = self.dirty_queues[ag].front() else {
                    break;
                };
                let Some(ip) = self.inodes.get(&ino) else {
                    self.dirty_queues[ag].pop_front();
                    continue;
                };
                let at = ip.dirtied_at.unwrap_or_else(Instant::now);
                if !due(at, background, expired) || ip.wb_busy || !small(ip) {
                    break;
                }
                bytes += ip.cache.bytes();
                self.dirty_queues[ag].pop_front();
                out.push(ino);
            }
        }
        out
    }

    /// After a pass over `ino`: back on its list (at the end) if still dirty.
    pub(super) fn requeue(&mut self, ino: u64) {
        let ag = self.meta.geo.inode_ag(ino) as usize;
        if let Some(ip) = self.inodes.get_mut(&ino) {
            if ip.cache.any_dirty() || ip.size != ip.d.size {
                self.dirty_queues[ag].push_back(ino);
            } else {
                ip.dirtied_at = None;
            }
        }
    }

    /// Background writeback starts above this.
    pub(in crate::fs) fn background_bytes(&self) -> u64 {
        self.opts.dirty_limit_bytes / 2
    }
}

impl Shared {
    /// The combined bandwidth of the contexts in use (bytes/s), or a
    /// conservative guess before any has been measured.
    pub(super) fn bandwidth(&self) -> u64 {
        let n = self.knobs.wb_contexts.load(Ordering::Relaxed);
        let bw: u64 = self.wb_stats[..n]
            .iter()
            .map(|s| s.bandwidth.load(Ordering::Relaxed))
            .sum();
        if bw == 0 {
            100 << 20
        } else {
            bw
        }
    }

    /// balance_dirty_pages: called by a writer after dirtying `bytes` of
    /// `ino`, with no lock held. Below the midpoint between the background
    /// threshold and the limit it returns at once; above, it sleeps for
    /// the time writeback needs for those bytes, scaled up the closer
    /// dirty memory is to the limit; at the limit it waits for writeback
    /// to make room (and writes back its own file if none comes).
    pub(in crate::fs) fn balance_dirty(&self, ino: u64, bytes: u64) -> Result<()> {
        let mut g = self.inner.lock();
        let limit = g.opts.dirty_limit_bytes.max(1);
        let bg = g.background_bytes();
        let freerun = (bg + limit) / 2;
        if g.dirty_bytes > bg {
            self.wb_kick.notify_all();
        }
        if g.dirty_bytes <= freerun {
            return Ok(());
        }
        let start = Instant::now();
        bump(&self.counters.throttle_waits, 1);
        if g.dirty_bytes < limit {
            let pos = (limit - g.dirty_bytes) as f64 / (limit - freerun).max(1) as f64;
            let pause =
                Duration::from_secs_f64(bytes as f64 / (self.bandwidth() as f64 * pos.max(0.01)))
                    .min(MAX_PAUSE);
            drop(g);
            std::thread::sleep(pause);
        } else {
            while g.dirty_bytes >= limit {
                g.meta.check_live()?;
                let quiet = self
                    .wb_done
                    .wait_for(&mut g, Duration::from_millis(50))
                    .timed_out();
                if quiet && g.dirty_bytes >= limit {
                    // No writeback finished meanwhile: do some ourselves.
                    g = self
                        .writeback_inode(g, ino, PASS_BYTES / self.block_size)?
                        .0;
                }
            }
        }
        bump(
            &self.counters.throttle_wait_ns,
            start.elapsed().as_nanos() as u64,
        );
        Ok(())
    }

    /// The loop of writeback context `id`.
    pub(super) fn context_loop(self: Arc<Self>, id: usize) {
        let (interval, expire) = {
            let g = self.inner.lock();
            (
                Duration::from_millis(g.opts.writeback_interval_ms),
                Duration::from_millis(g.opts.dirty_expire_ms),
            )
        };
        let periodic = !interval.is_zero();
        let mut last_pass = Instant::now();
        let mut g = self.inner.lock();
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let n = self.knobs.wb_contexts.load(Ordering::Relaxed);
            if id >= n || g.meta.is_shutdown() {
                self.wb_kick.wait_for(&mut g, Duration::from_secs(1));
                continue;
            }
            let background = g.dirty_bytes > g.background_bytes();
            let now = Instant::now();
            // Without a period, nothing ever expires.
            let expired = periodic.then(|| now.checked_sub(expire)).flatten();
            if let Some((ino, below)) = g.pick_dirty(id, n, background, expired) {
                let start = Instant::now();
                let mut inos = if below == u64::MAX {
                    g.pick_more_due(ino, id, n, background, expired)
                } else {
                    Vec::new()
                };
                if !inos.is_empty() {
                    // Small files due together: one batch (writeback_many).
                    inos.push(ino);
                    g = match self.writeback_many(g, inos.clone()) {
                        Ok((g2, bytes)) => {
                            self.account(id, bytes, start.elapsed());
                            g2
                        }
                        Err(e) => {
                            log::error!("writeback context {id}: {e}");
                            self.inner.lock()
                        }
                    };
                    for ino in inos {
                        g.requeue(ino);
                    }
                    if let Err(e) = g.maybe_commit() {
                        log::error!("writeback context {id}: {e}");
                    }
                    continue;
                }
                match self.writeback_below(g, ino, PASS_BYTES / self.block_size, below) {
                    Ok((g2, bytes)) => {
                        g = g2;
                        if below == u64::MAX {
                            g.requeue(ino);
                        } else if bytes == 0 {
                            // Nothing behind the writer after all (a
                            // truncate took it, or the folios near the
                            // writer wait for writes still on their
                            // way): start counting afresh.
                            if let Some(ip) = g.inodes.get_mut(&ino) {
                                ip.stream_dirty = 0;
                            }
                        }
                        self.account(id, bytes, start.elapsed());
                        if let Err(e) = g.maybe_commit() {
                            log::error!("writeback context {id}: {e}");
                        }
                    }
                    Err(e) => {
                        log::error!("writeback context {id}: {e}");
                        g = self.inner.lock();
                    }
                }
                continue;
            }
            if periodic && now.duration_since(last_pass) >= interval {
                last_pass = now;
                if id == 0 {
                    g.pool.trim_idle();
                }
                // Context 0 also commits the journal on the period, so
                // metadata is never more than about one period old.
                if id == 0 && g.meta.has_running() {
                    g = match self.commit_sync(g) {
                        Ok(g) => g,
                        Err(e) => {
                            log::error!("periodic commit: {e}");
                            self.inner.lock()
                        }
                    };
                }
                continue;
            }
            let wait = if periodic {
                interval
            } else {
                Duration::from_secs(1)
            };
            self.wb_kick.wait_for(&mut g, wait);
        }
    }

    pub(super) fn account(&self, id: usize, bytes: u64, took: Duration) {
        let st = &self.wb_stats[id];
        bump(&st.bytes, bytes);
        bump(&st.passes, 1);
        if bytes >= 1 << 20 {
            let now = (bytes as f64 / took.as_secs_f64().max(1e-6)) as u64;
            let old = st.bandwidth.load(Ordering::Relaxed);
            let new = if old == 0 { now } else { (old * 7 + now) / 8 };
            st.bandwidth.store(new, Ordering::Relaxed);
        }
    }
}

impl Fs {
    /// Start writeback context threads up to `n`.
    pub(in crate::fs) fn start_workers(&self, n: usize) {
        let mut w = self.workers.lock();
        while w.len() < n.min(crate::fs::MAX_WB_CONTEXTS) {
            let s = self.s.clone();
            let id = w.len();
            let h = std::thread::Builder::new()
                .name(format!("foliofs-wb{id}"))
                .spawn(move || s.context_loop(id))
                .expect("spawn writeback thread");
            w.push(h);
        }
    }

    pub(in crate::fs) fn stop_workers(&self) {
        self.s.stopping.store(true, Ordering::SeqCst);
        {
            let _g = self.s.inner.lock();
            self.s.wb_kick.notify_all();
        }
        for h in self.workers.lock().drain(..) {
            let _ = h.join();
        }
        self.stop_ahead_threads();
    }

    /// Set the number of writeback contexts (1 ..= MAX_WB_CONTEXTS). Each
    /// inode moves to the context of its AG under the new count.
    pub fn set_writeback_contexts(&self, n: usize) {
        let n = n.clamp(1, crate::fs::MAX_WB_CONTEXTS);
        self.s.knobs.wb_contexts.store(n, Ordering::Relaxed);
        if !self.s.stopping.load(Ordering::SeqCst) && !self.s.inner.lock().opts.read_only {
            self.start_workers(n);
        }
        let _g = self.s.inner.lock();
        self.s.wb_kick.notify_all();
    }

    /// Per-context writeback statistics of the contexts in use.
    pub fn writeback_stats(&self) -> Vec<crate::fs::WritebackContextStats> {
        let n = self.s.knobs.wb_contexts.load(Ordering::Relaxed);
        self.s.wb_stats[..n]
            .iter()
            .enumerate()
            .map(|(id, s)| crate::fs::WritebackContextStats {
                context: id,
                bytes: s.bytes.load(Ordering::Relaxed),
                passes: s.passes.load(Ordering::Relaxed),
                bandwidth: s.bandwidth.load(Ordering::Relaxed),
            })
            .collect()
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

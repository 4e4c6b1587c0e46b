//! Group commit: many threads' changes made durable by one journal write
//! and one flush, without the metadata lock held over the write. While
//! one transaction is being written, other threads add to the next one,
//! and the first of them to get the journal seals and writes them all.
//!
//! The metadata lock is the caller's (the file system's one lock over
//! namespace, mapping and the journal); group commit reaches what it
//! guards through `Journaled`, and lets go of it for each write, flush
//! and wait.

use super::{Meta, MAX_IN_FLIGHT};
use crate::error::Result;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What the metadata lock guards, as group commit sees it.
pub(crate) trait Journaled {
    /// The journal and metadata cache.
    fn meta(&mut self) -> &mut Meta;
    /// The committers gathering for the next durable transaction.
    fn batch(&mut self) -> &mut Batch;
    /// Counts one wait for a group to gather.
    fn waited_for_group(&mut self) {}
}

/// Durable commits batched across threads, as jbd2 batches fsync: a
/// committer that expects others (the last group had more than one)
/// waits a moment, at most about one commit's time, for them to join the
/// running transaction, so one write and one flush serve them all.
/// Commits that only write (direct overwrites) never wait for others: a
/// flush is what batching saves.
#[derive(Default)]
pub(crate) struct Batch {
    /// The running transaction being gathered for, and its committers.
    pub seq: u64,
    pub joined: usize,
    /// Threads committing now, and how many there were when the last
    /// durable transaction was sealed (the group to expect).
    pub active: usize,
    pub last_group: usize,
    /// Committers asleep in the wait for the group (`GroupCommit::written`).
    pub waiting: usize,
    /// Average time of a commit's write and flush.
    pub avg_ns: u64,
}

/// Commits under one metadata lock: wakes the committers waiting for
/// their group when its write completes.
#[derive(Default)]
pub(crate) struct GroupCommit {
    /// Signalled (with the metadata lock) when a durable commit's write
    /// completes while committers wait for their group to gather.
    written: Condvar,
}

impl GroupCommit {
    /// Make every change made so far durable (`durable`), or with
    /// `durable` false only written to the log, not necessarily flushed
    /// (what a plain direct overwrite needs: its data on the device, like
    /// XFS's, no flush). `g` is `lock`'s guard; it is let go of and taken
    /// again while the journal is written.
    pub(crate) fn commit<'a, T: Journaled>(
        &self,
        lock: &'a Mutex<T>,
        mut g: MutexGuard<'a, T>,
        durable: bool,
    ) -> Result<MutexGuard<'a, T>> {
        if !durable {
            return self.commit_inner(lock, g, false);
        }
        g.batch().active += 1;
        match self.commit_inner(lock, g, true) {
            Ok(mut g) => {
                g.batch().active -= 1;
                Ok(g)
            }
            Err(e) => {
                lock.lock().batch().active -= 1;
                Err(e)
            }
        }
    }

    fn commit_inner<'a, T: Journaled>(
        &self,
        lock: &'a Mutex<T>,
        mut g: MutexGuard<'a, T>,
        durable: bool,
    ) -> Result<MutexGuard<'a, T>> {
        // The transaction holding the caller's changes: the running one,
        // or, when that is empty, the last sealed.
        let mut target = g.meta().running_seq();
        if !g.meta().has_running() {
            match target.checked_sub(1) {
                Some(t) => target = t,
                None => return Ok(g),
            }
        }
        let mut joined = false;
        let mut waited = false;
        loop {
            g.meta().reap()?;
            g.meta().check_live()?;
            let reached = if durable {
                g.meta().done_seq() > target
            } else {
                // Its own write, not the ones before it: the data is on
                // the device (a flush that makes it durable waits for
                // them all).
                g.meta().written_seq() > target || g.meta().journal_io().written_ok(target)
            };
            if reached {
                return Ok(g);
            }
            if target >= g.meta().running_seq() {
                // Still running: seal and write it, beside the writes in
                // flight, if there is room.
                if durable && !joined {
                    joined = true;
                    let b = g.batch();
                    if b.seq != target {
                        b.seq = target;
                        b.joined = 0;
                    }
                    // No wake-up for those waiting: the committer that
                    // completes the group seals it itself, and they sleep
                    // on until its write completes (below).
                    b.joined += 1;
                }
                if durable && !waited && g.batch().joined < g.batch().last_group {
                    // Others committed with us last time: give them a
                    // moment to join this one.
                    waited = true;
                    let wait = Duration::from_nanos(g.batch().avg_ns.clamp(20_000, 2_000_000));
                    let deadline = Instant::now() + wait;
                    g.batch().waiting += 1;
                    while g.batch().seq == target
                        && g.batch().joined < g.batch().last_group
                        && g.meta().running_seq() <= target
                        && !self.written.wait_until(&mut g, deadline).timed_out()
                    {
                    }
                    g.batch().waiting -= 1;
                    g.waited_for_group();
                    continue;
                }
                if g.meta().in_flight() < MAX_IN_FLIGHT {
                    if durable {
                        // Committers now: the group to expect next time.
                        g.batch().last_group = g.batch().active;
                    }
                    match g.meta().seal_with(durable)? {
                        Some(tx) => {
                            drop(g);
                            let t = Instant::now();
                            tx.write();
                            let ns = t.elapsed().as_nanos() as u64;
                            g = lock.lock();
                            if durable {
                                g.batch().avg_ns = (g.batch().avg_ns * 7 + ns) / 8;
                            }
                            if g.batch().waiting > 0 {
                                // Those who waited for the group are done
                                // if it is theirs, and look again if not.
                                self.written.notify_all();
                            }
                        }
                        // Emptied since (its blocks freed): what is left
                        // of the caller's changes was sealed before.
                        None => match g.meta().running_seq().checked_sub(1) {
                            Some(t) => target = t,
                            None => return Ok(g),
                        },
                    }
                    continue;
                }
            } else if durable && g.meta().written_seq() > target {
                // Written without a flush: one flush makes it durable.
                let upto = g.meta().written_seq();
                let dev = g.meta().dev.clone();
                drop(g);
                let r = dev.flush();
                g = lock.lock();
                if let Err(e) = r {
                    return Err(g.meta().poison(format!("journal flush failed: {e}")));
                }
                g.meta().mark_durable(upto);
                g.meta().stats.flushes += 1;
                continue;
            }
            // Wait for a journal write to complete.
            let io = g.meta().journal_io();
            let ticket = io.completions();
            drop(g);
            io.wait_after(ticket);
            g = lock.lock();
        }
    }
}

//! The records of read-ahead for sequential direct readers (`ahead`):
//! one read ahead, kept on its inode (`Inode::dio_ahead`), and the queue
//! of the thread that reads them (`Shared::ahead`). Apart from `ahead`
//! so that the inode and the shared state hold them without depending
//! on the code that runs them.

use super::iolock::Lock;
use super::verify::DeviceRuns;
use crate::device::AlignedBuf;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;

/// One read ahead: `len` bytes at `offset` of an inode (in its
/// `dio_ahead`).
pub(crate) struct Ahead {
    pub offset: u64,
    pub len: usize,
    pub(super) state: Mutex<State>,
    pub(super) done: Condvar,
}

pub(super) enum State {
    /// Waiting for the thread: a reader that wants it reads for itself.
    Queued,
    Running,
    /// `n` bytes of file data (the rest of the last block as on the
    /// device: the reader zeroes it after checking it), as of data
    /// generation `gen` with the I/O lock `lock` taken exclusive `excl`
    /// times; not yet checked against `runs`' checksums.
    Read {
        buf: AlignedBuf,
        runs: DeviceRuns,
        n: usize,
        gen: u64,
        lock: Lock,
        excl: u64,
    },
    /// Dropped, failed, or taken.
    Gone,
}

/// The read-ahead thread's queue (`Shared::ahead`).
#[derive(Default)]
pub(crate) struct AheadQueue {
    pub(super) jobs: Mutex<VecDeque<(u64, Arc<Ahead>)>>,
    pub(super) kick: Condvar,
    pub(super) spare: Mutex<Vec<AlignedBuf>>,
}

impl AheadQueue {
    /// Wake the thread (at unmount, to see `Shared::stopping`).
    pub(in crate::fs) fn wake(&self) {
        let _q = self.jobs.lock();
        self.kick.notify_all();
    }
}

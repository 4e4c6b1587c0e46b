//! A device for crash and fault testing.
//!
//! Every write since the last flush is kept in order. A power cut can land
//! anywhere: the writes of the last completed flush are durable, and of the
//! writes after it any subset may have reached the medium, in any order,
//! each possibly torn at 512-byte sector granularity. [`CrashLog`] replays
//! the history so a test can walk every flush epoch and build such images.

use super::Device;
use parking_lot::Mutex;
use rand::Rng;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Sector size at which writes may tear.
pub const SECTOR: usize = 512;

/// When to inject I/O errors: the n-th operation of a kind (counting from 0)
/// and every later one fails; `u64::MAX` never fails.
#[derive(Debug)]
pub struct FaultPlan {
    pub fail_read_from: AtomicU64,
    pub fail_write_from: AtomicU64,
    pub fail_flush_from: AtomicU64,
    /// Writes touching device bytes [start, end) fail (data-only faults).
    pub fail_write_start: AtomicU64,
    pub fail_write_end: AtomicU64,
    /// Each flush first sleeps this many microseconds (a disk's flush
    /// takes time; 0, the default, does not).
    pub flush_delay_us: AtomicU64,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            fail_read_from: AtomicU64::new(u64::MAX),
            fail_write_from: AtomicU64::new(u64::MAX),
            fail_flush_from: AtomicU64::new(u64::MAX),
            fail_write_start: AtomicU64::new(0),
            fail_write_end: AtomicU64::new(0),
            flush_delay_us: AtomicU64::new(0),
        }
    }
}

struct State {
    current: Vec<u8>,
    /// Completed flush epochs: the writes between two flushes.
    epochs: Vec<Vec<(u64, Vec<u8>)>>,
    /// Writes since the last flush.
    pending: Vec<(u64, Vec<u8>)>,
    record: bool,
}

pub struct CrashDevice {
    initial: Vec<u8>,
    state: Mutex<State>,
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    pub faults: FaultPlan,
}

impl CrashDevice {
    /// A device starting from `image`; history is recorded from here on.
    pub fn new(image: Vec<u8>) -> Self {
        CrashDevice {
            initial: image.clone(),
            state: Mutex::new(State {
                current: image,
                epochs: Vec::new(),
                pending: Vec::new(),
                record: true,
            }),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            faults: FaultPlan::default(),
        }
    }

    /// Stop keeping history (for fault tests that do not need it).
    pub fn stop_recording(&self) {
        let mut s = self.state.lock();
        s.record = false;
        s.epochs.clear();
        s.pending.clear();
    }

    /// Reads attempted so far (failed ones included).
    pub fn read_count(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// Writes attempted so far (failed ones included).
    pub fn write_count(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Number of completed flushes.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    /// The device as the engine sees it now.
    pub fn image(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }

    /// The recorded history, for building crash images.
    pub fn log(&self) -> CrashLog {
        let s = self.state.lock();
        let mut epochs = s.epochs.clone();
        epochs.push(s.pending.clone());
        CrashLog {
            initial: self.initial.clone(),
            epochs,
        }
    }

    fn fault(counter: &AtomicU64, from: &AtomicU64, what: &str) -> io::Result<()> {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        if n >= from.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!("injected {what} error")));
        }
        Ok(())
    }
}

impl Device for CrashDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        Self::fault(&self.reads, &self.faults.fail_read_from, "read")?;
        let s = self.state.lock();
        super::mem::check_range(s.current.len() as u64, offset, buf.len())?;
        buf.copy_from_slice(&s.current[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        Self::fault(&self.writes, &self.faults.fail_write_from, "write")?;
        let (a, b) = (
            self.faults.fail_write_start.load(Ordering::SeqCst),
            self.faults.fail_write_end.load(Ordering::SeqCst),
        );
        if offset < b && offset + buf.len() as u64 > a {
            return Err(io::Error::other("injected write error in a faulty range"));
        }
        let mut s = self.state.lock();
        super::mem::check_range(s.current.len() as u64, offset, buf.len())?;
        s.current[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        if s.record {
            s.pending.push((offset, buf.to_vec()));
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        // A failed flush leaves pending writes in limbo, exactly like a
        // real device: they may or may not be durable.
        let n = self.flushes.load(Ordering::SeqCst);
        if n >= self.faults.fail_flush_from.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected flush error"));
        }
        let delay = self.faults.flush_delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        let mut s = self.state.lock();
        if s.record {
            let pending = std::mem::take(&mut s.pending);
            s.epochs.push(pending);
        }
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn len(&self) -> u64 {
        self.state.lock().current.len() as u64
    }
}

/// The recorded write history of a [`CrashDevice`]: the starting image and
/// one list of writes per flush epoch (the last one not yet flushed).
pub struct CrashLog {
    pub initial: Vec<u8>,
    pub epochs: Vec<Vec<(u64, Vec<u8>)>>,
}

impl CrashLog {
    /// Walk the history; before applying epoch `e` (so with exactly `e`
    /// flushes durable), call `f(e, image)` `per_epoch` times, each with a
    /// random subset of epoch `e`'s writes applied, some torn.
    pub fn for_each_cut(
        &self,
        per_epoch: usize,
        rng: &mut impl Rng,
        mut f: impl FnMut(usize, Vec<u8>),
    ) {
        let mut durable = self.initial.clone();
        for (e, writes) in self.epochs.iter().enumerate() {
            for _ in 0..per_epoch {
                let mut img = durable.clone();
                apply_random_subset(&mut img, writes, rng);
                f(e, img);
            }
            for (off, data) in writes {
                durable[*off as usize..*off as usize + data.len()].copy_from_slice(data);
            }
        }
    }

    /// Number of flushes recorded.
    pub fn flushes(&self) -> usize {
        self.epochs.len().saturating_sub(1)
    }
}

/// Apply each write with probability 1/2, and tear one in four of those that
/// apply: only a random subset of their sectors lands.
pub fn apply_random_subset(img: &mut [u8], writes: &[(u64, Vec<u8>)], rng: &mut impl Rng) {
    // A prefix of the epoch always lands in order (the device was part-way
    // through), then the rest lands in arbitrary order and subset.
    let prefix = rng.random_range(0..=writes.len());
    for (i, (off, data)) in writes.iter().enumerate() {
        let off = *off as usize;
        if i < prefix {
            img[off..off + data.len()].copy_from_slice(data);
            continue;
        }
        if !rng.random_bool(0.5) {
            continue;
        }
        if rng.random_bool(0.25) && data.len() > SECTOR {
            for (s, chunk) in data.chunks(SECTOR).enumerate() {
                if rng.random_bool(0.5) {
                    let at = off + s * SECTOR;
                    img[at..at + chunk.len()].copy_from_slice(chunk);
                }
            }
        } else {
            img[off..off + data.len()].copy_from_slice(data);
        }
    }
}

//! Checkpoints in the background: flushes go on while chunk PUTs are
//! held up, and wait only once the WAL not yet folded reaches its bound;
//! a checkpoint that fails is tried again and, until one succeeds, the
//! WAL keeps everything; readers racing checkpoints never read a block
//! older than the last flush before their read, and a block written again
//! while its checkpoint runs keeps the newer bytes.

mod common;

use common::{BeforePut, SIZE};
use foliofs::device::Device;
use foliofs_object::{InMemory, ObjectDevice, ObjectOptions, ObjectStore, Path};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK: u64 = 4096;
const CHUNK: u64 = 4 << 20;

/// Folded at 1 MiB of WAL, however spread (the bound flushes wait at is
/// then 2 MiB).
fn opts() -> ObjectOptions {
    ObjectOptions {
        checkpoint_bytes: 1 << 20,
        sparse_fold: 1,
        cache_bytes: 16 << 20,
        retry: Duration::ZERO,
        ..Default::default()
    }
}

/// A gate chunk PUTs wait at while it is shut.
#[derive(Default)]
struct Gate {
    shut: Mutex<bool>,
    opened: Condvar,
    /// PUTs that came to it.
    arrived: AtomicU64,
}

impl Gate {
    fn pass(&self) {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let mut shut = self.shut.lock();
        while *shut {
            self.opened.wait(&mut shut);
        }
    }

    fn set(&self, shut: bool) {
        *self.shut.lock() = shut;
        self.opened.notify_all();
    }
}

/// Write `mib` MiB of blocks at MiB `at` (each block's first bytes say
/// its number and `round`) and flush.
fn write_mib(dev: &ObjectDevice, at: u64, mib: u64, round: u8) -> std::io::Result<()> {
    for k in 0..mib * (1 << 20) / BLOCK {
        let b = at * (1 << 20) / BLOCK + k;
        let mut d = vec![round; BLOCK as usize];
        d[..8].copy_from_slice(&b.to_le_bytes());
        dev.write_at(&d, b * BLOCK)?;
    }
    dev.flush()
}

/// Each block `b` reads as `write_mib` wrote it in its `round`.
fn expect_blocks(dev: &ObjectDevice, blocks: &[(u64, u8)]) {
    let mut got = vec![0; 4096];
    for &(b, round) in blocks {
        dev.read_at(&mut got, b * BLOCK).unwrap();
        assert_eq!(got[..8], b.to_le_bytes(), "block {b}");
        assert_eq!(got[8], round, "block {b}");
    }
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < until, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// With every chunk PUT held up, flushes return until the WAL not yet
/// folded reaches twice `checkpoint_bytes`; the next waits, and goes on
/// once the checkpointer can PUT again.
#[test]
fn flushes_do_not_wait_for_checkpoints_until_they_fall_behind() {
    let gate = Arc::new(Gate::default());
    let inner = Arc::new(InMemory::new());
    let store: Arc<dyn ObjectStore> = Arc::new(BeforePut::new(inner, {
        let gate = gate.clone();
        move |p: &Path| {
            if p.as_ref().contains("/chunk/") {
                gate.pass();
            }
            Ok(())
        }
    }));
    let dev = Arc::new(ObjectDevice::create(store, Path::from("img"), SIZE, opts()).unwrap());
    gate.set(true);
    // 1 MiB: the checkpointer starts, and waits at the gate.
    write_mib(&dev, 0, 1, 1).unwrap();
    wait_for("a checkpoint under way", || {
        dev.stats().unfolded_bytes >= 1 << 20
    });
    // Under twice checkpoint_bytes: returns at once.
    let t = Instant::now();
    dev.write_at(&[2; 4096], 8 << 20).unwrap();
    dev.flush().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(dev.stats().checkpoints, 0);
    // Past it: the flush waits for the checkpointer.
    let returned = Arc::new(AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (dev, returned) = (dev.clone(), returned.clone());
        move || {
            let r = write_mib(&dev, 2, 1, 3);
            returned.store(true, Ordering::SeqCst);
            r
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !returned.load(Ordering::SeqCst),
        "a flush past the bound waited: {:?}",
        dev.stats()
    );
    gate.set(false);
    writer.join().unwrap().unwrap();
    assert!(dev.stats().checkpoints >= 1, "{:?}", dev.stats());
    // Everything reads back, folded or not.
    let mut got = vec![0; 4096];
    expect_blocks(&dev, &[(0, 1), (200, 1), (600, 3)]);
    dev.read_at(&mut got, 8 << 20).unwrap();
    assert_eq!(got, vec![2; 4096]);
    dev.close().unwrap();
}

/// Chunk PUTs refused: the checkpoint fails and says so in the stats,
/// flushes go on until the bound and then fail naming why, and nothing
/// flushed is lost: once the store takes PUTs again, the checkpointer
/// folds it all, flushes succeed, and a clean close reopens whole.
#[test]
fn a_failing_checkpoint_is_tried_again_and_loses_nothing() {
    let refuse = Arc::new(AtomicBool::new(true));
    let inner = Arc::new(InMemory::new());
    let plain: Arc<dyn ObjectStore> = inner.clone();
    let store: Arc<dyn ObjectStore> = Arc::new(BeforePut::new(inner, {
        let refuse = refuse.clone();
        move |p: &Path| {
            if p.as_ref().contains("/chunk/") && refuse.load(Ordering::SeqCst) {
                return Err(object_store::Error::Generic {
                    store: "test",
                    source: "chunk PUTs refused".into(),
                });
            }
            Ok(())
        }
    }));
    let dev = ObjectDevice::create(store, Path::from("img"), SIZE, opts()).unwrap();
    write_mib(&dev, 0, 1, 1).unwrap();
    wait_for("the checkpoint failed", || {
        dev.stats().checkpoint_failed.is_some()
    });
    let why = dev.stats().checkpoint_failed.unwrap();
    assert!(why.contains("chunk PUTs refused"), "{why}");
    // The bound reached: the flush fails, naming the cause.
    let e = write_mib(&dev, 1, 1, 2).unwrap_err();
    assert!(
        e.to_string().contains("not being folded") && e.to_string().contains("refused"),
        "{e}"
    );
    refuse.store(false, Ordering::SeqCst);
    wait_for("a checkpoint after the store came back", || {
        dev.stats().checkpoints > 0
    });
    assert_eq!(dev.stats().checkpoint_failed, None);
    write_mib(&dev, 1, 1, 3).unwrap();
    dev.close().unwrap();
    let again = ObjectDevice::open(plain, Path::from("img"), ObjectOptions::default()).unwrap();
    expect_blocks(&again, &[(0, 1), (255, 1), (256, 3), (511, 3)]);
    again.close().unwrap();
}

/// A writer overwrites blocks 1..16 of the first 16 of each of 8 chunks
/// round after round, flushing each, while checkpoints fold them into
/// new chunk versions and delete the old; readers read those 16 blocks
/// at once (block 0, never written, comes from the chunk, the rest from
/// the WAL or the chunk, whichever holds them at that moment) and check
/// that each reads as the round last flushed before the read began, or a
/// later one.
#[test]
fn reads_racing_checkpoints_see_every_flushed_write() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev = Arc::new(
        ObjectDevice::create(
            store,
            Path::from("img"),
            SIZE,
            ObjectOptions {
                checkpoint_bytes: 64 << 10,
                cache_bytes: 8 << 20,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let spans: Vec<u64> = (0..8).map(|c| c * CHUNK / BLOCK).collect();
    let flushed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (dev, flushed, stop, spans) =
                (dev.clone(), flushed.clone(), stop.clone(), spans.clone());
            std::thread::spawn(move || {
                let mut got = vec![0; 16 << 12];
                let mut reads = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    for &b in spans.iter().skip(r) {
                        let at_least = flushed.load(Ordering::SeqCst);
                        dev.read_at(&mut got, b * BLOCK).unwrap();
                        for (k, d) in got.chunks(4096).enumerate().skip(1) {
                            let round = u64::from_le_bytes(d[..8].try_into().unwrap());
                            assert!(
                                round >= at_least,
                                "block {} read as round {round} after round {at_least} was \
                                 flushed",
                                b + k as u64
                            );
                        }
                        reads += 1;
                    }
                }
                reads
            })
        })
        .collect();
    for round in 1..=300u64 {
        let mut d = vec![round as u8; 15 << 12];
        for k in 0..15 {
            d[k << 12..(k << 12) + 8].copy_from_slice(&round.to_le_bytes());
        }
        for &b in &spans {
            dev.write_at(&d, (b + 1) * BLOCK).unwrap();
        }
        dev.flush().unwrap();
        flushed.store(round, Ordering::SeqCst);
    }
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    assert!(dev.stats().checkpoints >= 20, "{:?}", dev.stats());
    dev.close().unwrap();
}

/// A checkpoint reads a chunk back from the store only to keep the
/// blocks the WAL does not cover: a chunk written whole is not fetched.
#[test]
fn a_chunk_written_whole_is_not_read_back_by_its_checkpoint() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev = ObjectDevice::create(store.clone(), Path::from("img"), SIZE, opts()).unwrap();
    // Chunks 3 and 4 (MiB 12 to 20) written whole, folded, closed.
    write_mib(&dev, 12, 8, 1).unwrap();
    dev.checkpoint_now().unwrap();
    dev.close().unwrap();
    let dev = ObjectDevice::open(store.clone(), Path::from("img"), opts()).unwrap();
    write_mib(&dev, 12, 4, 2).unwrap();
    dev.write_at(&[9; 4096], 16 << 20).unwrap();
    dev.flush().unwrap();
    dev.checkpoint_now().unwrap();
    assert_eq!(
        dev.stats().chunk_gets,
        1,
        "only chunk 4, one block of it rewritten, was read back: {:?}",
        dev.stats()
    );
    dev.close().unwrap();
    let dev = ObjectDevice::open(store, Path::from("img"), opts()).unwrap();
    let mut got = vec![0; 4096];
    expect_blocks(&dev, &[(3072, 2), (4095, 2), (4097, 1), (5119, 1)]);
    dev.read_at(&mut got, 16 << 20).unwrap();
    assert_eq!(got, vec![9; 4096]);
    dev.close().unwrap();
}

/// A checkpoint drops from memory only the blocks it folded, not a later
/// write of one of them: 1 MiB written in one `write_at` (its blocks share
/// one buffer) starts a checkpoint, which waits at its first chunk PUT;
/// three of its blocks are written again and flushed meanwhile. They read
/// as the second write before the checkpoint, after it, and after the
/// image is opened again.
#[test]
fn a_block_written_again_during_its_checkpoint_keeps_the_newer_bytes() {
    let gate = Arc::new(Gate::default());
    let inner = Arc::new(InMemory::new());
    let store: Arc<dyn ObjectStore> = Arc::new(BeforePut::new(inner.clone(), {
        let gate = gate.clone();
        move |p: &Path| {
            if p.as_ref().contains("/chunk/") {
                gate.pass();
            }
            Ok(())
        }
    }));
    let dev = ObjectDevice::create(store, Path::from("img"), SIZE, opts()).unwrap();
    gate.set(true);
    let blocks = |first: u64, n: u64, round: u8| {
        let mut d = vec![round; (n * BLOCK) as usize];
        for k in 0..n {
            let at = (k * BLOCK) as usize;
            d[at..at + 8].copy_from_slice(&(first + k).to_le_bytes());
        }
        d
    };
    dev.write_at(&blocks(0, 256, 1), 0).unwrap();
    dev.flush().unwrap();
    wait_for("the checkpoint at its first chunk PUT", || {
        gate.arrived.load(Ordering::SeqCst) > 0
    });
    dev.write_at(&blocks(5, 3, 9), 5 * BLOCK).unwrap();
    dev.flush().unwrap();
    let want = [(4, 1), (5, 9), (6, 9), (7, 9), (8, 1), (255, 1)];
    expect_blocks(&dev, &want);
    gate.set(false);
    wait_for("the checkpoint done", || dev.stats().checkpoints >= 1);
    expect_blocks(&dev, &want);
    dev.close().unwrap();
    let again = ObjectDevice::open(
        inner,
        Path::from("img"),
        ObjectOptions {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    expect_blocks(&again, &want);
}

/// A random writer's WAL, a few blocks in each of many chunks, is folded
/// later than a sequential writer's: at `checkpoint_bytes` its fold would
/// write sixteen times its bytes in chunks, so it waits until
/// `sparse_fold` times as much has gathered. A WAL of long runs (its
/// fold writing at most twice its bytes) is folded at `checkpoint_bytes`.
#[test]
fn a_sparse_wal_is_folded_later_than_a_dense_one() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let opts = ObjectOptions {
        sparse_fold: 3,
        ..opts()
    };
    let dev = ObjectDevice::create(store, Path::from("img"), SIZE, opts).unwrap();
    // Block k of the sparse writer: one of 16 chunks in turn.
    let sparse_block = |k: u64| (k % 16) * (CHUNK / BLOCK) + 1 + k / 16;
    let write_sparse = |ks: std::ops::Range<u64>| {
        for k in ks {
            let b = sparse_block(k);
            let mut d = vec![7; BLOCK as usize];
            d[..8].copy_from_slice(&b.to_le_bytes());
            dev.write_at(&d, b * BLOCK).unwrap();
        }
        dev.flush().unwrap();
        dev.settle().unwrap();
    };
    // 1 MiB, then 2.75 MiB: nothing due, nothing folded.
    write_sparse(0..256);
    assert_eq!(dev.stats().checkpoints, 0, "{:?}", dev.stats());
    write_sparse(256..704);
    let st = dev.stats();
    assert_eq!(
        (st.checkpoints, st.unfolded_bytes),
        (0, 704 * BLOCK),
        "{st:?}"
    );
    // 3 MiB: folded, all 16 chunks.
    write_sparse(704..768);
    let st = dev.stats();
    assert_eq!((st.checkpoints, st.chunk_puts), (1, 16), "{st:?}");
    assert_eq!(st.unfolded_bytes, 0, "{st:?}");
    // Half a chunk, 2 MiB: its fold writes twice that, due at once.
    write_mib(&dev, 8, 2, 1).unwrap();
    dev.settle().unwrap();
    let st = dev.stats();
    assert_eq!((st.checkpoints, st.chunk_puts), (2, 17), "{st:?}");
    // The sparse blocks the run did not write over.
    let sparse = (0..768)
        .step_by(37)
        .map(sparse_block)
        .filter(|b| !(2048..2560).contains(b));
    let mut got = vec![0; BLOCK as usize];
    for b in sparse {
        dev.read_at(&mut got, b * BLOCK).unwrap();
        assert_eq!(got[..8], b.to_le_bytes(), "block {b}");
        assert_eq!(got[8], 7, "block {b}");
    }
    expect_blocks(&dev, &[(2048, 1), (2559, 1)]);
    dev.close().unwrap();
}

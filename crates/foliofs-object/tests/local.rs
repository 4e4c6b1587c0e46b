//! `durability=local` and the cache directory on the crate's in-memory
//! store: a flush that returns once its blocks are in the local WAL, the
//! lag behind the store bounded, a restart from the same cache directory
//! shipping what had not shipped, a takeover from another machine
//! dropping it, and chunks served from the directory.

mod common;

use common::{mkfs_with as mkfs, write_files, BeforePut};
use foliofs::device::Device;
use foliofs::{Fs, MountOptions};
use foliofs_object::{Durability, InMemory, ObjectDevice, ObjectOptions, ObjectStore, Path};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

fn cache_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("foliofs-local-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn local(dir: &std::path::Path) -> ObjectOptions {
    ObjectOptions {
        cache_dir: Some(dir.to_path_buf()),
        durability: Durability::Local,
        ..Default::default()
    }
}

/// A store whose WAL PUTs fail (as a store that cannot be reached does)
/// while `gate` is shut.
fn gated(inner: Arc<InMemory>, gate: Arc<AtomicBool>) -> Arc<dyn ObjectStore> {
    Arc::new(BeforePut::new(inner, move |key| {
        if key.as_ref().contains("/wal/") && !gate.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "test",
                source: "the store is cut off".into(),
            });
        }
        Ok(())
    }))
}

fn ro_mount() -> MountOptions {
    MountOptions {
        read_only: true,
        ..Default::default()
    }
}

/// Wait until everything flushed has shipped (`Device::settle`).
fn settle(dev: &ObjectDevice) {
    dev.settle().unwrap();
    assert_eq!(
        dev.stats().unshipped_bytes,
        0,
        "settled with records unshipped"
    );
}

fn content(i: usize) -> Vec<u8> {
    (0..9000 + i * 1311)
        .map(|k| (k * 7 + i * 13) as u8)
        .collect()
}

/// Every file `f i` for i in `files` reads back whole (and no file past
/// them is there), and fsck finds the image clean.
fn verify(dev: Arc<ObjectDevice>, files: std::ops::Range<usize>) {
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    for i in files.clone() {
        let a = fs
            .lookup(fs.root_ino(), format!("f{i}").as_bytes())
            .unwrap_or_else(|e| panic!("f{i}: {e}"));
        let want = content(i);
        let mut got = vec![0; want.len()];
        assert_eq!(fs.read(a.ino, 0, &mut got).unwrap(), want.len(), "f{i}");
        assert!(got == want, "f{i} content");
    }
    let past = format!("f{}", files.end);
    assert!(fs.lookup(fs.root_ino(), past.as_bytes()).is_err(), "{past}");
    fs.unmount().unwrap();
    let r = foliofs::fsck::fsck(dev, &Default::default(), |_, _| {}).unwrap();
    assert!(r.is_clean(), "fsck: {:?}", r.problems);
}

/// The writer's machine up again: the image opened with takeover from
/// the same cache directory `dir` holds files `files` whole; then closed,
/// and `dir` removed.
fn restart_verifies(
    store: Arc<dyn ObjectStore>,
    dir: &std::path::Path,
    files: std::ops::Range<usize>,
) {
    let opts = ObjectOptions {
        takeover: true,
        ..local(dir)
    };
    let dev = Arc::new(ObjectDevice::open(store, Path::from("img"), opts).unwrap());
    verify(dev.clone(), files);
    dev.close().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Files fsynced while the store could take no WAL are durable in the
/// local WAL alone: the writer stops there (dropped, its machine up
/// again), and opening the image from the same cache directory ships
/// them first.
#[test]
fn a_restart_from_the_cache_dir_ships_what_was_flushed_locally() {
    let dir = cache_dir("restart");
    let inner = Arc::new(InMemory::new());
    let gate = Arc::new(AtomicBool::new(true));
    let store = gated(inner.clone(), gate.clone());
    let dev = mkfs(store.clone(), local(&dir));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_files(&fs, 0..3, content);
    settle(&dev);
    gate.store(false, Ordering::SeqCst);
    write_files(&fs, 3..10, content);
    let st = dev.stats();
    assert!(st.unshipped_bytes > 0, "{st:?}");
    assert!(st.fenced.is_none(), "{st:?}");
    drop(fs);
    drop(dev);
    // Without the cache directory, the store alone: the first files only.
    let plain: Arc<dyn ObjectStore> = inner.clone();
    let ro = ObjectOptions {
        read_only: true,
        ..Default::default()
    };
    let seen = Arc::new(ObjectDevice::open(plain, Path::from("img"), ro).unwrap());
    let fs = Fs::mount(seen, ro_mount()).unwrap();
    assert!(fs.lookup(fs.root_ino(), b"f2").is_ok());
    assert!(fs.lookup(fs.root_ino(), b"f3").is_err());
    drop(fs);
    gate.store(true, Ordering::SeqCst);
    restart_verifies(store, &dir, 0..10);
}

/// Another machine that takes the image over while this writer's local
/// WAL has not shipped: the writer is fenced when its shipper finds the
/// WAL number taken, its next fsync fails, and what only its local WAL
/// held is dropped when it starts again (the image is the new writer's).
#[test]
fn a_takeover_fences_a_local_writer_and_drops_its_unshipped_wal() {
    let dir = cache_dir("takeover");
    let inner = Arc::new(InMemory::new());
    let gate = Arc::new(AtomicBool::new(true));
    let store = gated(inner.clone(), gate.clone());
    let dev = mkfs(store.clone(), local(&dir));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_files(&fs, 0..2, content);
    settle(&dev);
    gate.store(false, Ordering::SeqCst);
    write_files(&fs, 100..104, content);
    // The other machine: the store itself, an empty cache.
    let other: Arc<dyn ObjectStore> = inner.clone();
    let opts = ObjectOptions {
        takeover: true,
        ..Default::default()
    };
    let dev2 = Arc::new(ObjectDevice::open(other, Path::from("img"), opts).unwrap());
    let fs2 = Fs::mount(dev2.clone(), MountOptions::default()).unwrap();
    write_files(&fs2, 2..4, content);
    fs2.unmount().unwrap();
    dev2.close().unwrap();
    // The old writer's shipper finds its next WAL number taken.
    gate.store(true, Ordering::SeqCst);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while dev.stats().fenced.is_none() {
        assert!(std::time::Instant::now() < until, "never fenced");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let f = fs.create(fs.root_ino(), b"late", 0o644, 0, 0).unwrap();
    fs.write(f.ino, 0, b"late").unwrap();
    assert!(fs.fsync(f.ino, false).is_err(), "a fenced writer's fsync");
    drop(fs);
    drop(dev);
    let opts = ObjectOptions {
        takeover: true,
        ..local(&dir)
    };
    let dev = Arc::new(ObjectDevice::open(store, Path::from("img"), opts).unwrap());
    verify(dev.clone(), 0..4);
    let fs = Fs::mount(dev.clone(), ro_mount()).unwrap();
    assert!(fs.lookup(fs.root_ino(), b"f100").is_err());
    drop(fs);
    dev.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// While the store takes WAL objects slowly, fsyncs return as soon as
/// the local WAL has them, and never with more than `wal_lag_max`
/// unshipped.
#[test]
fn writers_wait_only_for_the_lag_to_shrink_below_its_bound() {
    let dir = cache_dir("lag");
    let inner = Arc::new(InMemory::new());
    let puts = Arc::new(AtomicU64::new(0));
    let counted = puts.clone();
    let store: Arc<dyn ObjectStore> = Arc::new(BeforePut::new(inner.clone(), move |key| {
        if key.as_ref().contains("/wal/") {
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        Ok(())
    }));
    let lag = 1 << 20;
    let opts = ObjectOptions {
        wal_lag_max: lag,
        ..local(&dir)
    };
    let dev = mkfs(store.clone(), opts);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let f = fs.create(fs.root_ino(), b"big", 0o644, 0, 0).unwrap();
    let piece: Vec<u8> = (0..128 << 10).map(|k| (k % 251) as u8).collect();
    let mut most = 0;
    for i in 0..64u64 {
        fs.write(f.ino, i * piece.len() as u64, &piece).unwrap();
        fs.fsync(f.ino, true).unwrap();
        let st = dev.stats();
        assert!(
            st.unshipped_bytes <= lag,
            "{} unshipped",
            st.unshipped_bytes
        );
        most = most.max(st.unshipped_bytes);
    }
    assert!(most > 0, "no fsync returned before its WAL shipped");
    let flushes = 64;
    assert!(
        puts.load(Ordering::SeqCst) < flushes,
        "records were not shipped together: {} PUTs",
        puts.load(Ordering::SeqCst)
    );
    fs.unmount().unwrap();
    dev.close().unwrap();
    assert_eq!(dev.stats().unshipped_bytes, 0);
    let plain: Arc<dyn ObjectStore> = inner;
    let dev = Arc::new(ObjectDevice::open(plain, Path::from("img"), Default::default()).unwrap());
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let a = fs.lookup(fs.root_ino(), b"big").unwrap();
    let mut got = vec![0; piece.len()];
    for i in 0..64u64 {
        fs.read(a.ino, i * piece.len() as u64, &mut got).unwrap();
        assert!(got == piece, "piece {i}");
    }
    fs.unmount().unwrap();
    dev.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Chunks fetched once are read from the cache directory by the next
/// device that opens it: no GET.
#[test]
fn chunks_come_from_the_cache_dir_on_the_next_open() {
    let dir = cache_dir("chunks");
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev = mkfs(store.clone(), ObjectOptions::default());
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_files(&fs, 0..20, content);
    fs.unmount().unwrap();
    dev.close().unwrap();
    let cached = ObjectOptions {
        cache_dir: Some(dir.clone()),
        ..Default::default()
    };
    for round in 0..2 {
        let dev =
            Arc::new(ObjectDevice::open(store.clone(), Path::from("img"), cached.clone()).unwrap());
        verify(dev.clone(), 0..20);
        let st = dev.stats();
        let disk = st.cache_dir.clone().unwrap();
        if round == 0 {
            assert!(st.chunk_gets > 0, "{st:?}");
        } else {
            assert_eq!(st.chunk_gets, 0, "{st:?}");
            assert!(disk.hits > 0, "{disk:?}");
        }
        dev.close().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const BLOCK: u64 = 4096;
/// Blocks of a 256 KiB chunk.
const CHUNK: u64 = 64;

/// Block `b`'s bytes in the `small_chunks` tests.
fn block(b: u64) -> Vec<u8> {
    vec![(b % 251) as u8; BLOCK as usize]
}

/// A new 64 MiB image of 256 KiB chunks caching in `dir`, two chunks held
/// in memory, never checkpointed: its store, options and device.
fn small_chunks(dir: &std::path::Path) -> (Arc<dyn ObjectStore>, ObjectOptions, ObjectDevice) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let opts = ObjectOptions {
        cache_dir: Some(dir.to_path_buf()),
        chunk_bytes: CHUNK * BLOCK,
        cache_bytes: 2 * CHUNK * BLOCK,
        checkpoint_bytes: 1 << 40,
        ..Default::default()
    };
    let dev =
        ObjectDevice::create(store.clone(), Path::from("img"), 64 << 20, opts.clone()).unwrap();
    (store, opts, dev)
}

/// A chunk this writer makes (a flush's whole chunk, a checkpoint's) is
/// copied into the cache directory only when it leaves memory, and the
/// ones still held at close then: not as it is made, a write to the local
/// disk for every chunk that a flush would wait behind. The next open
/// from the directory reads them all with no GET.
#[test]
fn a_writers_chunks_reach_the_cache_dir_as_they_leave_memory() {
    let dir = cache_dir("lazy");
    let (store, opts, dev) = small_chunks(&dir);
    let copies = |dev: &ObjectDevice| dev.stats().cache_dir.unwrap().chunks;
    for b in 0..2 * CHUNK {
        dev.write_at(&block(b), b * BLOCK).unwrap();
    }
    dev.flush().unwrap();
    assert_eq!(dev.stats().chunks_flushed, 2);
    assert_eq!(copies(&dev), 0, "both held in memory: no copy yet");
    for b in 2 * CHUNK..6 * CHUNK {
        dev.write_at(&block(b), b * BLOCK).unwrap();
    }
    dev.flush().unwrap();
    assert_eq!(copies(&dev), 4, "the four that left memory");
    dev.close().unwrap();
    drop(dev);
    let dev = ObjectDevice::open(store, Path::from("img"), opts).unwrap();
    assert_eq!(copies(&dev), 6, "and the two held at close");
    let mut got = vec![0; BLOCK as usize];
    for b in 0..6 * CHUNK {
        dev.read_at(&mut got, b * BLOCK).unwrap();
        assert!(got == block(b), "block {b}");
    }
    let st = dev.stats();
    assert_eq!(st.chunk_gets, 0, "{st:?}");
    assert!(st.cache_dir.unwrap().hits >= 6);
    dev.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A random reader of more chunks than memory holds reads each block
/// from the cache directory's copy alone: nothing is fetched, and no
/// chunk is brought into memory for it (4 KiB read, not 256 KiB read,
/// checked and held). A copy changed on the disk fails that block's
/// check, and the chunk is fetched again, the block read right.
#[test]
fn a_random_reader_reads_blocks_from_the_cache_dir_copies_alone() {
    let dir = cache_dir("runs");
    let (store, opts, dev) = small_chunks(&dir);
    for b in 0..8 * CHUNK {
        dev.write_at(&block(b), b * BLOCK).unwrap();
    }
    dev.flush().unwrap();
    dev.close().unwrap();
    drop(dev);
    let dev = ObjectDevice::open(store, Path::from("img"), opts).unwrap();
    let mut got = vec![0; BLOCK as usize];
    for k in 0..200 {
        let b = (k * 37) % (8 * CHUNK);
        dev.read_at(&mut got, b * BLOCK).unwrap();
        assert!(got == block(b), "block {b}");
    }
    let st = dev.stats();
    assert_eq!((st.chunk_gets, st.chunks_held), (0, 0), "{st:?}");
    assert!(st.cache_dir.unwrap().hits >= 200);
    // Block 5 of chunk 3 changed in its copy.
    let copy = std::fs::read_dir(dir.join("chunks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("3-"))
        .expect("chunk 3's copy");
    let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xee], 16 + 5 * BLOCK + 7).unwrap();
    let b = 3 * CHUNK + 5;
    dev.read_at(&mut got, b * BLOCK).unwrap();
    assert!(got == block(b), "block {b}, its copy changed");
    assert_eq!(dev.stats().chunk_gets, 1, "{:?}", dev.stats());
    dev.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Local records ship together: the fdatasyncs of 100 ms go to the store
/// as one WAL object (each block's newest version once), not one object
/// each, and still all ship.
#[test]
fn local_records_of_a_moment_ship_as_one_wal_object() {
    let dir = cache_dir("linger");
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev = ObjectDevice::create(store, Path::from("img"), 64 << 20, local(&dir)).unwrap();
    settle(&dev);
    let before = dev.stats().wal_puts;
    let t = std::time::Instant::now();
    for k in 0..40u64 {
        dev.write_at(&vec![k as u8; 4096], (k % 8) * 4096).unwrap();
        dev.flush().unwrap();
    }
    let took = t.elapsed();
    settle(&dev);
    let st = dev.stats();
    let puts = st.wal_puts - before;
    // 40 flushes within the linger ship in a PUT or two; a slow machine's
    // flushes spread over more of them.
    let most = 2 + (took.as_millis() / 100) as u64;
    assert!(
        puts <= most,
        "{puts} WAL PUTs for 40 flushes in {took:?} (at most {most}): {st:?}"
    );
    let mut got = vec![0; 4096];
    for b in 0..8u64 {
        dev.read_at(&mut got, b * 4096).unwrap();
        assert_eq!(got[0], (32 + b) as u8, "block {b}: its newest version");
    }
    dev.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `settle` returns once the local WAL has shipped and the checkpoint
/// it made due has folded it, with chunk PUTs slowed so that a settle
/// that did not wait for the checkpoint would see none finished.
#[test]
fn settle_waits_for_shipping_and_the_checkpoint_due() {
    let dir = cache_dir("settle");
    let inner = Arc::new(InMemory::new());
    let slow: Arc<dyn ObjectStore> = Arc::new(BeforePut::new(inner, |key| {
        if key.as_ref().contains("/chunk/") {
            std::thread::sleep(std::time::Duration::from_millis(150));
        }
        Ok(())
    }));
    // Due at 256 KiB, however spread the files' blocks are.
    let opts = ObjectOptions {
        checkpoint_bytes: 256 << 10,
        sparse_fold: 1,
        ..local(&dir)
    };
    let dev = mkfs(slow, opts);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let before = dev.stats().checkpoints;
    write_files(&fs, 0..40, content);
    dev.settle().unwrap();
    let st = dev.stats();
    assert_eq!(st.unshipped_bytes, 0, "{st:?}");
    assert!(st.checkpoints > before, "no checkpoint folded: {st:?}");
    assert!(
        st.unfolded_bytes < 256 << 10,
        "a checkpoint still due: {st:?}"
    );
    drop(fs);
    dev.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two writers fsyncing at once, their records appended in turn and
/// synced outside the append (one sync covering the other's record at
/// times), while the store takes no WAL: the writer stops, and a restart
/// from the same cache directory finds every file either fsynced.
#[test]
fn concurrent_local_flushes_all_survive_a_restart() {
    let dir = cache_dir("concurrent");
    let inner = Arc::new(InMemory::new());
    let gate = Arc::new(AtomicBool::new(true));
    let store = gated(inner.clone(), gate.clone());
    let dev = mkfs(store.clone(), local(&dir));
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
    settle(&dev);
    gate.store(false, Ordering::SeqCst);
    let writers: Vec<_> = [0..40, 40..80]
        .into_iter()
        .map(|files| {
            let fs = fs.clone();
            std::thread::spawn(move || write_files(&fs, files, content))
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    assert!(dev.stats().unshipped_bytes > 0);
    drop(fs);
    drop(dev);
    gate.store(true, Ordering::SeqCst);
    restart_verifies(store, &dir, 0..80);
}

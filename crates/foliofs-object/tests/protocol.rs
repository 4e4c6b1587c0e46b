//! The object device's protocol on the crate's in-memory store: an image
//! made, written with fsync, its machine lost (the device dropped without
//! a close), and mounted again with takeover; a second writer fencing the
//! first; a store cut after any PUT, with every fsynced file there after.

mod common;

use common::{cut_store, mkfs_with, verify_files, write_files, SIZE};
use foliofs::device::Device;
use foliofs::{Fs, MkfsOptions, MountOptions};
use foliofs_object::{
    InMemory, ObjectDevice, ObjectError, ObjectOptions, ObjectStats, ObjectStore, Path,
};
use object_store::PutPayload;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn takeover() -> ObjectOptions {
    ObjectOptions {
        takeover: true,
        ..Default::default()
    }
}

fn mkfs(store: Arc<dyn ObjectStore>) -> Arc<ObjectDevice> {
    mkfs_with(store, Default::default())
}

fn content(i: usize) -> Vec<u8> {
    (0..5000 + i * 777).map(|k| (k * 31 + i) as u8).collect()
}

/// Every file `name i` for i in `files` reads back whole, and fsck finds
/// the image clean.
fn verify(dev: Arc<ObjectDevice>, files: std::ops::Range<usize>) {
    verify_files(dev, files, content)
}

/// Files written and fsynced on a device dropped without a close (the
/// machine lost) are all there on a new device with takeover.
#[test]
fn a_lost_writer_loses_nothing_fsynced() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev = mkfs(store.clone());
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_files(&fs, 0..12, content);
    // The machine is gone: nothing more reaches the store from it.
    std::mem::forget(fs);
    let plain = ObjectDevice::open(store.clone(), Path::from("img"), Default::default());
    match plain {
        Err(ObjectError::Held { writer, .. }) => assert_eq!(writer.pid, std::process::id()),
        Err(e) => panic!("a held image opened with: {e}"),
        Ok(_) => panic!("a held image opened without takeover"),
    }
    let dev2 = Arc::new(ObjectDevice::open(store, Path::from("img"), takeover()).unwrap());
    assert!(dev2.stats().epoch > dev.stats().epoch);
    verify(dev2, 0..12);
}

/// A second writer's takeover fences the first: its next flush fails,
/// and what it writes after is never read.
#[test]
fn a_takeover_fences_the_old_writer() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let a = mkfs(store.clone());
    let block = 2000 * 4096;
    a.write_at(&[1; 4096], block).unwrap();
    a.flush().unwrap();
    let b = ObjectDevice::open(store.clone(), Path::from("img"), takeover()).unwrap();
    let mut got = vec![0; 4096];
    b.read_at(&mut got, block).unwrap();
    assert_eq!(
        got,
        vec![1; 4096],
        "the new writer sees what the old one flushed"
    );
    a.write_at(&[2; 4096], block).unwrap();
    let e = a.flush().unwrap_err();
    assert!(e.to_string().contains("fenced"), "{e}");
    assert!(
        a.write_at(&[3; 4096], block).is_err(),
        "a fenced writer writes nothing"
    );
    assert!(a.flush().is_err(), "and every later flush fails");
    b.write_at(&[4; 4096], block + 4096).unwrap();
    b.flush().unwrap();
    b.close().unwrap();
    let c = ObjectDevice::open(store, Path::from("img"), Default::default()).unwrap();
    c.read_at(&mut got, block).unwrap();
    assert_eq!(got, vec![1; 4096], "the fenced write is never read");
    c.read_at(&mut got, block + 4096).unwrap();
    assert_eq!(got, vec![4; 4096]);
}

/// A writer stopped while another took over, checkpointed and swept the
/// WAL it had read (a process paused, a machine cut off for hours): its
/// next flush still finds its WAL number taken, by the fence kept for
/// good, and fails; nothing it wrote is read.
#[test]
fn a_writer_fenced_long_ago_still_fails_after_its_fence_was_folded() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let a = mkfs(store.clone());
    let block = 3000 * 4096;
    a.write_at(&[1; 4096], block).unwrap();
    a.flush().unwrap();
    for round in 0..3u8 {
        let b = ObjectDevice::open(store.clone(), Path::from("img"), takeover()).unwrap();
        b.write_at(&[10 + round; 4096], block + 4096).unwrap();
        b.flush().unwrap();
        b.close().unwrap();
    }
    foliofs_object::collect_garbage(store.clone(), &Path::from("img")).unwrap();
    a.write_at(&[2; 4096], block).unwrap();
    let e = a.flush().unwrap_err();
    assert!(e.to_string().contains("fenced"), "{e}");
    let c = ObjectDevice::open(store, Path::from("img"), Default::default()).unwrap();
    let mut got = vec![0; 4096];
    c.read_at(&mut got, block).unwrap();
    assert_eq!(got, vec![1; 4096], "the fenced write is never read");
    c.read_at(&mut got, block + 4096).unwrap();
    assert_eq!(got, vec![12; 4096]);
}

/// Two writers racing: in even rounds both claim the same image at the
/// same moment, in odd rounds the second claims while the first is
/// flushing (its flushes racing the claim's fence for WAL numbers). Both
/// claims may succeed (the later fences the earlier); a writer's flushes
/// fail from its first refused one on; once both have claimed, exactly
/// one goes on, the one with the higher epoch; and every flush that
/// returned Ok, on either side, is in the image, while the last one the
/// loser tried is not.
#[test]
fn two_writers_racing_for_the_claim_and_every_wal_number_one_goes_on() {
    let flushes = [400u64, 12];
    for round in 0..16u64 {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        mkfs(store.clone()).close().unwrap();
        let start = Arc::new(std::sync::Barrier::new(2));
        let end = Arc::new(std::sync::Barrier::new(2));
        let racers: Vec<_> = (0..2u64)
            .map(|t| {
                let (store, start, end) = (store.clone(), start.clone(), end.clone());
                std::thread::spawn(move || {
                    let together = round % 2 == 0;
                    if t == 1 || together {
                        start.wait();
                    }
                    if t == 1 && !together {
                        std::thread::sleep(std::time::Duration::from_millis(1 + round));
                    }
                    let opened = ObjectDevice::open(store, Path::from("img"), takeover());
                    if t == 0 && !together {
                        start.wait();
                    }
                    // A claim that found a higher epoch's fence below its
                    // own writes nothing.
                    let dev = match opened {
                        Ok(dev) => dev,
                        Err(ObjectError::Fenced(why)) => {
                            assert!(why.contains("same moment"), "{why}");
                            end.wait();
                            return (Vec::new(), false, None);
                        }
                        Err(e) => panic!("round {round}: writer {t}: {e}"),
                    };
                    let mut done = Vec::new();
                    for i in 0..flushes[t as usize] {
                        let block = (4000 + t * 1000 + i) * 4096;
                        let ok = dev
                            .write_at(&[(t * 50 + i % 50 + 1) as u8; 4096], block)
                            .is_ok()
                            && dev.flush().is_ok();
                        if !ok {
                            break;
                        }
                        done.push(i);
                        if t == 0 {
                            std::thread::sleep(std::time::Duration::from_micros(100));
                        }
                    }
                    // A refused flush is refused for good.
                    let refused = (done.len() as u64) < flushes[t as usize];
                    if refused {
                        assert!(dev.flush().is_err(), "round {round}: writer {t} came back");
                    }
                    // Both have claimed: one more flush each.
                    end.wait();
                    let last = (4000 + t * 1000 + 999) * 4096;
                    let again = dev.write_at(&[0xee; 4096], last).is_ok() && dev.flush().is_ok();
                    assert!(!(refused && again), "round {round}: writer {t} came back");
                    (done, again, Some(dev))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let goes_on: Vec<bool> = racers.iter().map(|(_, again, _)| *again).collect();
        let epochs: Vec<u64> = racers
            .iter()
            .map(|(_, _, d)| d.as_ref().map_or(0, |d| d.stats().epoch))
            .collect();
        let winner = if epochs[0] > epochs[1] { 0 } else { 1 };
        assert_eq!(
            goes_on,
            [winner == 0, winner == 1],
            "round {round}: {goes_on:?} {:?}",
            epochs
        );
        for dev in racers.iter().filter_map(|(_, _, d)| d.as_ref()) {
            let _ = dev.close();
        }
        let reader = ObjectDevice::open(
            store,
            Path::from("img"),
            ObjectOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        for (t, (done, again, _)) in racers.iter().enumerate() {
            let t = t as u64;
            let mut got = vec![0; 4096];
            reader
                .read_at(&mut got, (4000 + t * 1000 + 999) * 4096)
                .unwrap();
            assert_eq!(
                got == vec![0xee; 4096],
                *again,
                "round {round}: writer {t}'s last"
            );
            for &i in done {
                let mut got = vec![0; 4096];
                reader
                    .read_at(&mut got, (4000 + t * 1000 + i) * 4096)
                    .unwrap();
                let want = (t * 50 + i % 50 + 1) as u8;
                assert!(
                    got.iter().all(|&b| b == want),
                    "round {round}: writer {t} flush {i}"
                );
            }
        }
    }
}

/// Checkpoints fold the WAL into chunks and delete what they replaced;
/// the image reads the same from a fresh device after a clean close.
#[test]
fn checkpoints_fold_the_wal_and_a_clean_close_needs_no_takeover() {
    let store = Arc::new(InMemory::new());
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let dev = ObjectDevice::create(
        dyn_store.clone(),
        Path::from("img"),
        SIZE,
        ObjectOptions {
            checkpoint_bytes: 1 << 20,
            cache_bytes: 8 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let dev = Arc::new(dev);
    foliofs::mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_files(&fs, 0..40, content);
    fs.unmount().unwrap();
    // The checkpointer folds in the background, while the writes go on.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while dev.stats().checkpoints == 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let st = dev.stats();
    assert!(st.checkpoints > 0 && st.chunk_puts > 0, "{st:?}");
    dev.close().unwrap();
    let keys: Vec<String> = futures::executor::block_on(async {
        use futures::TryStreamExt;
        let l: Vec<_> = dyn_store
            .list(Some(&Path::from("img/wal")))
            .try_collect()
            .await
            .unwrap();
        l.into_iter().map(|m| m.location.to_string()).collect()
    });
    assert!(
        keys.is_empty(),
        "the WAL folded at close is deleted: {keys:?}"
    );
    let dev2 =
        Arc::new(ObjectDevice::open(dyn_store, Path::from("img"), Default::default()).unwrap());
    verify(dev2, 0..40);
}

/// Writes between two flushes are held in memory only up to
/// `pending_bytes`: past it a write flushes them itself, and they read
/// back and survive the loss of the writer.
#[test]
fn writes_held_in_memory_are_bounded() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let opts = ObjectOptions {
        pending_bytes: 1 << 20,
        ..Default::default()
    };
    let dev = ObjectDevice::create(store.clone(), Path::from("img"), SIZE, opts).unwrap();
    let block = |i: u64| vec![(i % 251) as u8; 64 << 10];
    for i in 0..64 {
        dev.write_at(&block(i), (8 << 20) + i * (64 << 10)).unwrap();
    }
    let st = dev.stats();
    assert!(
        st.wal_puts >= 3,
        "4 MiB written against a 1 MiB bound: {st:?}"
    );
    let mut got = vec![0; 64 << 10];
    for i in 0..64 {
        dev.read_at(&mut got, (8 << 20) + i * (64 << 10)).unwrap();
        assert!(got == block(i), "block run {i}");
    }
    std::mem::forget(dev);
    let dev = ObjectDevice::open(store, Path::from("img"), takeover()).unwrap();
    // What the bound flushed is there; what came after its last flush
    // was never acknowledged.
    dev.read_at(&mut got, 8 << 20).unwrap();
    assert!(got == block(0));
}

/// An object damaged behind the device's back is an error naming its
/// key, never data.
#[test]
fn a_damaged_wal_object_is_named() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev = mkfs(store.clone());
    dev.write_at(&[9; 4096], 4096 * 3000).unwrap();
    dev.flush().unwrap();
    let seq = dev.stats().next_wal - 1;
    std::mem::forget(dev);
    let key = Path::from(format!("img/wal/{seq:020}"));
    futures::executor::block_on(async {
        let mut b = store
            .get(&key)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec();
        b[50] ^= 0xff;
        store.put(&key, PutPayload::from(b)).await.unwrap();
    });
    let e = match ObjectDevice::open(store, Path::from("img"), takeover()) {
        Err(e) => e,
        Ok(_) => panic!("a damaged WAL object opened"),
    };
    assert!(e.to_string().contains(key.as_ref()), "{e}");
}

/// Cut the store after every number of PUTs the run makes: whatever
/// fsync acknowledged is there when another machine takes the image
/// over, and fsck finds it clean.
#[test]
fn a_cut_after_any_put_loses_nothing_fsynced() {
    cut_after_every_put(ObjectOptions::default(), content);
}

/// The same with files of 640 KiB on an image of 256 KiB chunks: their
/// fsyncs flush whole chunks, PUT before the WAL object that names them.
#[test]
fn a_cut_after_any_put_loses_nothing_fsynced_with_whole_chunks_flushed() {
    let opts = ObjectOptions {
        chunk_bytes: 256 << 10,
        ..Default::default()
    };
    let st = cut_after_every_put(opts, file_of_640k);
    assert!(
        st.chunks_flushed >= 6,
        "chunks flushed whole in the uncut run: {st:?}"
    );
}

/// The same with a bound on held writes of two chunks: the flushes it
/// makes inside each fsync's writeback PUT the chunks they hold whole
/// and leave the rest, which the fsync's own flush takes, completing
/// from the WAL a chunk an earlier file began.
#[test]
fn a_cut_after_any_put_loses_nothing_fsynced_with_flushes_for_the_bound() {
    let chunks = ObjectOptions {
        chunk_bytes: 256 << 10,
        ..Default::default()
    };
    let unbounded = cut_after_every_put(chunks.clone(), file_of_640k);
    let bounded = ObjectOptions {
        pending_bytes: 512 << 10,
        ..chunks
    };
    let st = cut_after_every_put(bounded, file_of_640k);
    assert!(
        st.wal_puts > unbounded.wal_puts,
        "flushes for the bound beside the fsyncs': {st:?} against {unbounded:?}"
    );
}

/// File `i` of 640 KiB (two chunks and a half), unlike every other's.
fn file_of_640k(i: usize) -> Vec<u8> {
    (0..640 << 10)
        .map(|k: usize| (k / 4096 * 7 + k + i) as u8)
        .collect()
}

/// Cut the store after 1, 2, ... PUTs of a run writing and fsyncing 6
/// files; returns the uncut run's counters.
fn cut_after_every_put(base: ObjectOptions, content: fn(usize) -> Vec<u8>) -> ObjectStats {
    let files = 6;
    let mut cut_at = 1;
    loop {
        let (inner, left, store) = cut_store();
        // A store out of reach for good: no waiting for it to return.
        let opts = ObjectOptions {
            retry: std::time::Duration::ZERO,
            ..base.clone()
        };
        let dev = mkfs_with(store.clone(), opts);
        left.store(cut_at, Ordering::SeqCst);
        let mut acked = 0;
        let ran = (|| {
            let fs = Fs::mount(dev.clone(), MountOptions::default())?;
            for i in 0..files {
                let f = fs.create(fs.root_ino(), format!("f{i}").as_bytes(), 0o644, 0, 0)?;
                fs.write(f.ino, 0, &content(i))?;
                fs.fsync(f.ino, false)?;
                acked = i + 1;
            }
            fs.unmount()?;
            Ok::<_, foliofs::Error>(())
        })();
        let whole = ran.is_ok();
        let stats = dev.stats();
        drop(dev);
        let inner: Arc<dyn ObjectStore> = inner;
        let dev2 = Arc::new(ObjectDevice::open(inner, Path::from("img"), takeover()).unwrap());
        verify_files(dev2, 0..acked, content);
        if whole {
            assert!(cut_at > files as u64, "every fsync made a PUT: {cut_at}");
            return stats;
        }
        cut_at += 1;
    }
}

/// An image made with chunks of 256 KiB or of 64 MiB (the smallest and
/// the largest) checkpoints, closes and reads back whole on a fresh
/// device, which takes the size from the manifest; a size that is not a
/// power of two in that range is refused when the image is made.
#[test]
fn images_keep_the_chunk_size_they_were_made_with() {
    for chunk_bytes in [256 << 10, 64 << 20] {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let dev = mkfs_with(
            store.clone(),
            ObjectOptions {
                chunk_bytes,
                checkpoint_bytes: 256 << 10,
                ..Default::default()
            },
        );
        assert_eq!(dev.stats().chunk_bytes, chunk_bytes);
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        write_files(&fs, 0..12, content);
        fs.unmount().unwrap();
        dev.close().unwrap();
        let cold =
            Arc::new(ObjectDevice::open(store, Path::from("img"), Default::default()).unwrap());
        let st = cold.stats();
        assert_eq!(st.chunk_bytes, chunk_bytes);
        assert!(
            st.chunks * chunk_bytes >= 256 << 10 && st.chunks <= SIZE / chunk_bytes,
            "{st:?}"
        );
        verify(cold, 0..12);
    }
    for bad in [3 << 20, 128 << 10, 128 << 20, 4096 * 1000] {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let opts = ObjectOptions {
            chunk_bytes: bad,
            ..Default::default()
        };
        match ObjectDevice::create(store, Path::from("img"), SIZE, opts) {
            Err(ObjectError::Invalid(why)) => assert!(why.contains("power of two"), "{why}"),
            Err(e) => panic!("chunk size {bad}: {e}"),
            Ok(_) => panic!("chunk size {bad} accepted"),
        }
    }
}

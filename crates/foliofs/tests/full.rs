//! A full file system keeps the two promises careful programs rely on:
//! an fsync that returns Ok covers everything written (no write is lost
//! later for lack of space), and what was durable is never damaged by a
//! later write, fallocate, truncate or rename that fails for lack of
//! space. Also the writes a client caches before the engine sees them
//! (the kernel's page cache over FUSE, `Fs::write_cached`): each goes in
//! whole or changes nothing, and the space kept for them
//! (`Fs::set_cache_reserve`) is theirs alone.

use foliofs::device::{CrashDevice, MemDevice};
use foliofs::fs::*;
use foliofs::{Error, Fs};
use std::sync::Arc;

mod common;
use common::fsck_clean;

const BS: u64 = 4096;

/// A 32 MiB file system on a crash-recording device, small journal.
fn small_fs() -> (Arc<CrashDevice>, Fs) {
    let mem = MemDevice::new(32 << 20);
    let o = MkfsOptions {
        block_size: BS as u32,
        ag_count: Some(2),
        journal_blocks: Some(64),
        ..Default::default()
    };
    mkfs(&mem, &o, |_, _| {}).unwrap();
    let dev = Arc::new(CrashDevice::new(mem.image()));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    (dev, fs)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| seed.wrapping_mul(31).wrapping_add((k / 7) as u8) | 1)
        .collect()
}

/// Blocks ordinary writes may still reserve.
fn avail(fs: &Fs) -> u64 {
    fs.statfs().unwrap().blocks_avail
}

/// Fill the file system with an fallocated ballast until ordinary
/// writes may reserve only `left` more blocks.
fn fill_to(fs: &Fs, left: u64) -> u64 {
    let b = fs
        .create(fs.root_ino(), b"ballast", 0o644, 0, 0)
        .unwrap()
        .ino;
    let mut size = 0;
    while avail(fs) > left {
        let n = (avail(fs) - left).min(2048);
        fs.fallocate(b, Falloc::Allocate { keep_size: false }, size, n * BS)
            .unwrap();
        size += n * BS;
    }
    assert_eq!(avail(fs), left);
    b
}

fn read_all(fs: &Fs, ino: u64) -> Vec<u8> {
    let size = fs.getattr(ino).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), size);
    buf
}

/// The kernel takes a short reply to its writeback as complete, so a
/// cached write that finds room for only part of its blocks must fail
/// whole and change nothing (before, it wrote what fitted and reported
/// that count: the rest was lost without a word, and fsync succeeded).
#[test]
fn a_cached_write_goes_in_whole_or_changes_nothing() {
    let (dev, fs) = small_fs();
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &pattern(1, 40_000)).unwrap();
    fs.fsync(f, false).unwrap();
    fill_to(&fs, 10);
    let before = avail(&fs);
    // 16 blocks past EOF, 10 free: refused whole.
    let e = fs.write_cached(f, 64 << 10, &pattern(2, 16 * BS as usize));
    assert!(matches!(e, Err(Error::NoSpace)), "{e:?}");
    assert_eq!(fs.getattr(f).unwrap().size, 40_000);
    assert_eq!(read_all(&fs, f), pattern(1, 40_000));
    assert_eq!(avail(&fs), before, "a refused write kept space");
    fs.check_invariants().unwrap();
    // Ordinary writes take the 10 blocks, a block at a time.
    let g = fs.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    let mut n = 0;
    while fs.write(g, n * BS, &pattern(3, BS as usize)).is_ok() {
        n += 1;
    }
    assert_eq!(n, 10);
    fs.unlink(root, b"g").unwrap();
    fs.sync().unwrap();
    // Overwrites need no space: one over written blocks goes in whole,
    // a partial block included.
    fs.write_cached(f, 100, &pattern(4, 30_000)).unwrap();
    fs.fsync(f, false).unwrap();
    let mut want = pattern(1, 40_000);
    want[100..30_100].copy_from_slice(&pattern(4, 30_000));
    assert_eq!(read_all(&fs, f), want);
    fs.check_invariants().unwrap();
    fs.unmount().unwrap();
    fsck_clean(dev.clone(), "after a refused cached write");
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    let f = fs.lookup(root, b"f").unwrap().ino;
    assert_eq!(read_all(&fs, f), want);
    fs.unmount().unwrap();
}

/// The space kept for a client's cache is refused to ordinary writes and
/// given to cached ones; once they take part of it the engine says so
/// (`cache_reserve_short`), and freeing space ends that without a
/// remount.
#[test]
fn the_cache_floor_is_kept_for_cached_writes_until_space_is_freed() {
    let (dev, fs) = small_fs();
    let root = fs.root_ino();
    let floor = 256 * BS;
    fs.set_cache_reserve(floor);
    assert!(!fs.cache_reserve_short());
    fill_to(&fs, 8);
    assert!(fs.cache_reservable_bytes() >= floor + 8 * BS);
    // Ordinary writes stop at the floor...
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    let mut n = 0;
    while fs.write(a, n * BS, &pattern(5, BS as usize)).is_ok() {
        n += 1;
    }
    assert_eq!(n, 8, "ordinary writes went past the floor");
    let d = fs.create(root, b"d", 0o644, 0, 0).unwrap().ino;
    assert!(matches!(
        fs.fallocate(d, Falloc::Allocate { keep_size: false }, 0, 16 * BS),
        Err(Error::NoSpace)
    ));
    // ... and cached ones go into it.
    let c = fs.create(root, b"c", 0o644, 0, 0).unwrap().ino;
    for k in 0..4u64 {
        fs.write_cached(c, k * 32 * BS, &pattern(6, 32 * BS as usize))
            .unwrap();
    }
    fs.fsync(c, false).unwrap();
    assert!(fs.cache_reserve_short(), "a cached write took the floor");
    fs.check_invariants().unwrap();
    // Freeing space covers the floor again, and writing goes on.
    fs.unlink(root, b"ballast").unwrap();
    assert!(!fs.cache_reserve_short());
    fs.write(a, n * BS, &pattern(7, 64 * BS as usize)).unwrap();
    fs.fsync(a, false).unwrap();
    // Giving the floor back makes its space available to all.
    let kept = avail(&fs);
    fs.set_cache_reserve(0);
    assert_eq!(avail(&fs), kept + 256);
    fs.check_invariants().unwrap();
    fs.unmount().unwrap();
    fsck_clean(dev, "after the floor was used and freed");
}

/// What was durable survives writes that fail for lack of space: an
/// extending write, a cached write, fallocate, a rename into a directory
/// that must grow, and a large overwrite (which, with no room for its new
/// copy, is logged instead) - also across a power cut right after.
#[test]
fn nothing_durable_is_damaged_by_what_fails_for_lack_of_space() {
    let (dev, fs) = small_fs();
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    let old = pattern(8, 3 << 20);
    fs.write(f, 0, &old).unwrap();
    let name = |k: usize| format!("name-{k:0>60}");
    for k in 0..40 {
        fs.create(d, name(k).as_bytes(), 0o644, 0, 0).unwrap();
    }
    fs.fsync(f, false).unwrap();
    fs.sync().unwrap();
    let e = fs.mkdir(root, b"e", 0o755, 0, 0).unwrap().ino;
    fill_to(&fs, 0);
    // Each fails for lack of space, or (the overwrite) needs none.
    let grown = fs.write(f, old.len() as u64, &pattern(9, 1 << 20));
    assert!(matches!(grown, Err(Error::NoSpace)), "{grown:?}");
    let cached = fs.write_cached(f, (3 << 20) - 4096, &pattern(9, 64 << 10));
    assert!(matches!(cached, Err(Error::NoSpace)), "{cached:?}");
    let fa = fs.fallocate(f, Falloc::Allocate { keep_size: true }, 4 << 20, 1 << 20);
    assert!(matches!(fa, Err(Error::NoSpace)), "{fa:?}");
    // Metadata takes the space kept for it, name by name.
    let m = fs.mkdir(root, b"m", 0o755, 0, 0).unwrap().ino;
    let mut made = 0;
    loop {
        match fs.create(m, format!("{made:0>250}").as_bytes(), 0o644, 0, 0) {
            Ok(_) => made += 1,
            Err(Error::NoSpace) => break,
            Err(x) => panic!("create: {x}"),
        }
        assert!(made < 1_000_000, "names never ran out of space");
    }
    // Renames into a directory that must grow, until it cannot.
    let mut moved = 0;
    while moved < 40 {
        let to = format!("moved-{moved:0>200}");
        match fs.rename(d, name(moved).as_bytes(), e, to.as_bytes(), 0) {
            Ok(()) => moved += 1,
            Err(Error::NoSpace) => break,
            Err(x) => panic!("rename: {x}"),
        }
    }
    assert!(moved < 40, "the directory never needed space");
    // A large overwrite with no room for a new copy: logged.
    let new = pattern(10, 1 << 20);
    fs.write(f, 1 << 20, &new).unwrap();
    fs.fsync(f, false).unwrap();
    let mut want = old.clone();
    want[1 << 20..2 << 20].copy_from_slice(&new);
    assert_eq!(read_all(&fs, f), want);
    // Every file has exactly one of its names.
    let named = |fs: &Fs, k: usize| {
        let at_old = fs.lookup(d, name(k).as_bytes()).is_ok();
        let at_new = fs.lookup(e, format!("moved-{k:0>200}").as_bytes()).is_ok();
        at_old != at_new
    };
    assert!((0..40).all(|k| named(&fs, k)));
    assert!(fs.shutdown_reason().is_none());
    fs.check_invariants().unwrap();
    // A power cut now: the fsynced state is what the image holds.
    let cut = dev.image();
    fs.unmount().unwrap();
    fsck_clean(dev.clone(), "after the failures");
    for (what, img) in [("unmounted", dev.image()), ("power cut", cut)] {
        let dev = Arc::new(MemDevice::from_image(img));
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let f = fs.lookup(d, b"f").unwrap().ino;
        assert_eq!(read_all(&fs, f), want, "{what}");
        for k in 0..40 {
            assert!(named(&fs, k), "{what}: file {k}");
        }
        fs.unmount().unwrap();
        fsck_clean(dev, what);
    }
}

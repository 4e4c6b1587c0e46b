//! The buffered path's techniques, end to end through the API: speculative
//! preallocation for tiny appends, writeback error reporting per open file
//! description, writeback contexts with background and periodic writeback,
//! (dirty throttling that bounds memory is tests/memory.rs, alone in its
//! process so its RSS is its own).

use foliofs::device::{Device, MemDevice};
use foliofs::fs::*;
use foliofs::Fs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod common;
use common::{
    check_small_files, crash_fs, fsck_clean, small_file, write_small_files, Hooked, Hooks,
};
use std::time::{Duration, Instant};

fn fresh(size: u64, opts: MountOptions) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(size));
    mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    let fs = Fs::mount(dev.clone(), opts).unwrap();
    (dev, fs)
}

/// Unmount, then fsck the device: clean.
/// A fresh file system with default options and one empty file `a`:
/// (device, file system, block size, the file's inode).
fn fresh_with_file(size: u64) -> (Arc<MemDevice>, Fs, u64, u64) {
    let (dev, fs) = fresh(size, MountOptions::default());
    let a = fs.create(fs.root_ino(), b"a", 0o644, 0, 0).unwrap().ino;
    let bs = fs.block_size();
    (dev, fs, bs, a)
}

fn unmount_and_check(fs: Fs, dev: Arc<dyn Device>) {
    fs.unmount().unwrap();
    fsck_clean(dev, "after unmount");
}

/// 1-byte appends with an fsync every 64 KiB (so writeback allocates from
/// the speculative range while the file grows); returns the counters'
/// mapping lookups and the appends made.
fn append_bytes(fs: &Fs, ino: u64, total: u64) -> (u64, u64) {
    let before = fs.counters().mapping_lookups;
    for i in 0..total {
        fs.write(ino, i, &[(i % 251) as u8 + 1]).unwrap();
        if i % (64 << 10) == (64 << 10) - 1 {
            fs.fsync(ino, true).unwrap();
        }
    }
    (fs.counters().mapping_lookups - before, total)
}

#[test]
fn tiny_appends_map_once_per_range_and_close_trims_the_rest() {
    let (dev, fs) = fresh(256 << 20, MountOptions::default());
    let root = fs.root_ino();
    let free_before = fs.statfs().unwrap().blocks_free;
    let a = fs.create(root, b"log", 0o644, 0, 0).unwrap();
    fs.open(a.ino).unwrap();
    let total = 3 << 20;
    let (lookups, appends) = append_bytes(&fs, a.ino, total);
    let per_append = lookups as f64 / appends as f64;
    assert!(
        per_append <= 0.01,
        "{lookups} lookups for {appends} appends"
    );
    let c = fs.counters();
    assert!(c.prealloc_reserved > 0 && c.prealloc_allocated > 0, "{c:?}");
    // While open, writeback has mapped blocks past EOF.
    let blocks = total.div_ceil(4096);
    let mapped: u64 = fs.extents(a.ino).unwrap().iter().map(|e| e.blocks).sum();
    assert!(
        mapped > blocks,
        "{mapped} blocks mapped for {blocks} of data"
    );
    fs.check_invariants().unwrap();
    // The last close trims them: one extent, exactly the data.
    fs.release(a.ino).unwrap();
    let ext = fs.extents(a.ino).unwrap();
    assert_eq!(ext.len(), 1, "{ext:?}");
    assert_eq!(ext[0].blocks, blocks);
    assert!(!ext[0].unwritten);
    assert!(fs.counters().prealloc_trimmed > 0);
    let mut back = vec![0u8; total as usize];
    fs.read(a.ino, 0, &mut back).unwrap();
    assert!(back
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i as u64 % 251) as u8 + 1));
    fs.sync().unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, free_before - blocks);
    unmount_and_check(fs, dev);
}

#[test]
fn mapping_by_write_length_looks_up_every_write() {
    let opts = MountOptions {
        map_by_write_length: true,
        ..Default::default()
    };
    let (_dev, fs) = fresh(64 << 20, opts);
    let a = fs.create(fs.root_ino(), b"log", 0o644, 0, 0).unwrap();
    let (lookups, appends) = append_bytes(&fs, a.ino, 256 << 10);
    assert!(
        lookups >= appends,
        "{lookups} lookups for {appends} appends"
    );
    assert_eq!(fs.counters().prealloc_reserved, 0);
    fs.check_invariants().unwrap();
    fs.unmount().unwrap();
}

#[test]
fn enospc_pressure_gives_back_speculative_space() {
    let (_dev, fs) = fresh(16 << 20, MountOptions::default());
    let root = fs.root_ino();
    // Many growing files each hold a speculative range...
    let files: Vec<u64> = (0..8)
        .map(|i| {
            let a = fs
                .create(root, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            fs.write(a.ino, 0, &vec![1u8; 300 << 10]).unwrap();
            a.ino
        })
        .collect();
    // ...and one big write still gets the space they hold.
    let free = fs.statfs().unwrap().blocks_avail * 4096;
    let big = fs.create(root, b"big", 0o644, 0, 0).unwrap();
    // More than is free outside the speculative ranges.
    let want = free + (100 << 10);
    let n = fs.write(big.ino, 0, &vec![2u8; want as usize]).unwrap();
    assert_eq!(n as u64, want);
    assert!(fs.counters().prealloc_trimmed > 0);
    for ino in files {
        fs.fsync(ino, false).unwrap();
    }
    fs.check_invariants().unwrap();
    fs.unmount().unwrap();
}

#[test]
fn writeback_error_is_reported_once_per_open_file_description() {
    let (dev, fs) = crash_fs(64 << 20);
    dev.stop_recording();
    let a = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap();
    // Allocate first, so the data's device blocks are known.
    fs.fallocate(a.ino, Falloc::Allocate { keep_size: false }, 0, 1 << 20)
        .unwrap();
    let e = fs.extents(a.ino).unwrap();
    let (start, end) = (
        e[0].device_block * 4096,
        (e[0].device_block + e[0].blocks) * 4096,
    );
    let (_, h1) = fs.open_file(a.ino).unwrap();
    let (_, h2) = fs.open_file(a.ino).unwrap();
    fs.write(a.ino, 0, &vec![7u8; 1 << 20]).unwrap();
    dev.faults.fail_write_start.store(start, Ordering::SeqCst);
    dev.faults.fail_write_end.store(end, Ordering::SeqCst);
    let r = fs.fsync_file(&h1, false);
    assert!(matches!(r, Err(foliofs::Error::Io(_))), "{r:?}");
    // Once per description: h1 has seen it, h2 has not.
    fs.fsync_file(&h1, false).unwrap();
    assert!(fs.fsync_file(&h2, true).is_err());
    fs.fsync_file(&h2, true).unwrap();
    // A description opened afterwards has nothing to hear.
    let (_, h3) = fs.open_file(a.ino).unwrap();
    fs.fsync_file(&h3, false).unwrap();
    // The file system stays up; the lost blocks read as zeros, not as
    // stale data or checksum errors.
    assert!(fs.shutdown_reason().is_none());
    let mut back = foliofs::device::AlignedBuf::zeroed(1 << 20);
    back.fill(1);
    fs.read_direct(a.ino, 0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    // With the device healthy again, writes go through.
    dev.faults.fail_write_end.store(0, Ordering::SeqCst);
    fs.write(a.ino, 0, b"again").unwrap();
    fs.fsync_file(&h1, false).unwrap();
    for h in [h1, h2, h3] {
        fs.release_file(h).unwrap();
    }
    unmount_and_check(fs, dev);
}

#[test]
fn writeback_contexts_write_back_in_the_background() {
    let opts = MountOptions {
        writeback_interval_ms: 20,
        dirty_expire_ms: 50,
        ..Default::default()
    };
    let dev = Arc::new(MemDevice::new(512 << 20));
    let mk = MkfsOptions {
        ag_count: Some(4),
        ..Default::default()
    };
    mkfs(&*dev, &mk, |_, _| {}).unwrap();
    let fs = Arc::new(Fs::mount(dev.clone(), opts.clone()).unwrap());
    assert_eq!(fs.writeback_stats().len(), 4);
    let root = fs.root_ino();
    // New directories rotate across AGs; files go to their parent's AG.
    let mut ags = Vec::new();
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            let d = fs.mkdir(root, &[b'd', b'0' + t], 0o755, 0, 0).unwrap();
            let f = fs.create(d.ino, b"f", 0o644, 0, 0).unwrap();
            let per_ag = fs.superblock().inodes_per_ag as u64;
            ags.push(d.ino / per_ag);
            assert_eq!(f.ino / per_ag, d.ino / per_ag);
            let fs = fs.clone();
            std::thread::spawn(move || {
                for i in 0..8u64 {
                    fs.write(f.ino, i << 20, &vec![t + 1; 1 << 20]).unwrap();
                }
                f.ino
            })
        })
        .collect();
    ags.sort();
    ags.dedup();
    assert_eq!(ags.len(), 4, "directories in {ags:?}");
    let inos: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // No fsync: the periodic pass writes old dirty data back by itself,
    // each file through the context of its AG.
    let deadline = Instant::now() + Duration::from_secs(10);
    let all_done = |fs: &Fs| fs.writeback_stats().iter().all(|c| c.bytes >= 8 << 20);
    while !all_done(&fs) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs.cache_stats().dirty_bytes, 0);
    let st = fs.writeback_stats();
    assert!(st.iter().all(|c| c.bytes >= 8 << 20), "{st:?}");
    // One context at run time: everything goes through context 0.
    fs.set_writeback_contexts(1);
    let before = fs.writeback_stats()[0].bytes;
    fs.write(inos[3], 0, &vec![9u8; 1 << 20]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs.writeback_stats()[0].bytes == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(fs.writeback_stats()[0].bytes >= before + (1 << 20));
    let fs = Arc::try_unwrap(fs).ok().unwrap();
    fs.unmount().unwrap();
    let fs = Fs::mount(dev.clone(), opts).unwrap();
    for (t, &ino) in inos.iter().enumerate() {
        let mut b = vec![0u8; 8 << 20];
        fs.read(ino, 0, &mut b).unwrap();
        let want = if t == 3 { 9 } else { t as u8 + 1 };
        assert!(b[..1 << 20].iter().all(|&x| x == want));
        assert!(b[1 << 20..].iter().all(|&x| x == t as u8 + 1));
        // The rewritten first MiB of the last file moved (an overwrite
        // that large is written out of place): one more extent.
        let most = if t == 3 { 2 } else { 1 };
        assert!(fs.extents(ino).unwrap().len() <= most);
    }
    fs.unmount().unwrap();
}

/// Folio memory freed by a delete or an eviction is reused by the next
/// writes instead of being mapped (and zeroed by the kernel) anew, within
/// the cache limit.
#[test]
fn freed_folio_memory_is_reused_within_the_cache_limit() {
    let cache = 8u64 << 20;
    let opts = MountOptions {
        cache_bytes: cache,
        dirty_limit_bytes: 4 << 20,
        ..MountOptions::default()
    };
    let (dev, fs) = fresh(64 << 20, opts);
    let root = fs.root_ino();
    let chunk = vec![7u8; 1 << 20];
    let write_file = |name: &[u8]| {
        let ino = fs.create(root, name, 0o644, 0, 0).unwrap().ino;
        for m in 0..4u64 {
            fs.write(ino, m << 20, &chunk).unwrap();
        }
        fs.fsync(ino, false).unwrap();
    };
    write_file(b"a");
    let mapped = fs.counters().folio_bytes_mapped;
    assert_eq!(mapped, 4 << 20, "the first file maps its folios");
    fs.unlink(root, b"a").unwrap();
    write_file(b"b");
    assert_eq!(fs.counters().folio_bytes_mapped, mapped, "reused");
    // Past the cache limit: folios are evicted to make room for new ones,
    // which take their memory; no more is ever mapped than the limit.
    for i in 0..8u8 {
        write_file(&[b'c', b'0' + i]);
    }
    let c = fs.counters();
    assert!(c.folios_evicted > 0);
    assert!(
        c.folio_bytes_mapped <= cache,
        "mapped {} bytes for 40 MiB written through a cache of {cache}",
        c.folio_bytes_mapped
    );
    unmount_and_check(fs, dev);
}

/// Drop-behind (the mount's setting): a folio leaves the cache once its
/// writeback completes, so a stream keeps a working set of buffers that
/// the next writes reuse instead of mapping fresh memory; what it wrote
/// reads back (from the device, checksums verified), a rewrite of part of
/// a dropped folio keeps the rest of it, and a folio dirtied again while
/// under writeback stays.
#[test]
fn drop_behind_frees_written_folios_for_the_next_writes() {
    let opts = MountOptions {
        drop_behind: true,
        ..MountOptions::default()
    };
    let (dev, fs) = fresh(256 << 20, opts);
    let root = fs.root_ino();
    let ino = fs.create(root, b"stream", 0o644, 0, 0).unwrap().ino;
    let mb = 1u64 << 20;
    let chunk = |m: u64| vec![(m % 251) as u8 + 1; mb as usize];
    for m in 0..4 {
        fs.write(ino, m * mb, &chunk(m)).unwrap();
    }
    fs.fsync(ino, false).unwrap();
    let c = fs.counters();
    assert!(c.folios_dropped_behind > 0, "nothing dropped behind");
    assert_eq!(
        fs.cache_stats().cached_bytes,
        0,
        "written folios stayed cached"
    );
    let mapped = c.folio_bytes_mapped;
    // The next 64 MiB reuse the buffers the first 4 MiB left behind:
    // write-behind and fsync keep the working set small.
    for m in 4..68 {
        fs.write(ino, m * mb, &chunk(m)).unwrap();
        if m % 4 == 3 {
            fs.fsync(ino, false).unwrap();
        }
    }
    let c = fs.counters();
    assert!(
        c.folio_bytes_mapped < mapped + (16 << 20),
        "mapped {} bytes more for 64 MiB written with drop-behind",
        c.folio_bytes_mapped - mapped
    );
    // A rewrite of 100 bytes inside a dropped folio: the rest of it reads
    // back from the device.
    fs.write(ino, 2 * mb + 10, &[0xee; 100]).unwrap();
    fs.fsync(ino, false).unwrap();
    let mut back = vec![0u8; 68 * mb as usize];
    assert_eq!(fs.read(ino, 0, &mut back).unwrap(), back.len());
    for m in 0..68u64 {
        let mut want = chunk(m);
        if m == 2 {
            want[10..110].fill(0xee);
        }
        assert!(
            back[(m * mb) as usize..((m + 1) * mb) as usize] == want[..],
            "MiB {m} reads back wrong"
        );
    }
    unmount_and_check(fs, dev);
}

/// Drop-behind for reads: a large read of whole blocks no folio holds
/// (the kernel's read-ahead through the mount) goes from the device into
/// the caller's buffer, checked, and maps no folio; a small read, a range
/// a folio holds (dirty data included) and an unaligned buffer read
/// through the cache; a flipped byte on the device is still an error.
#[test]
fn drop_behind_reads_large_uncached_ranges_past_the_cache() {
    let opts = MountOptions {
        drop_behind: true,
        ..MountOptions::default()
    };
    let (dev, fs) = fresh(256 << 20, opts);
    let ino = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    let mb = 1usize << 20;
    let data: Vec<u8> = (0..8 * mb).map(|i| (i / 4096 % 251) as u8 + 1).collect();
    for m in 0..8 {
        fs.write(ino, (m * mb) as u64, &data[m * mb..(m + 1) * mb])
            .unwrap();
    }
    fs.fsync(ino, false).unwrap();
    assert_eq!(fs.cache_stats().cached_bytes, 0, "written folios stayed");
    let mapped = fs.counters().folio_bytes_mapped;
    let mut buf = foliofs::device::AlignedBuf::zeroed(mb);
    assert_eq!(fs.read(ino, mb as u64, &mut buf).unwrap(), mb);
    assert!(buf[..] == data[mb..2 * mb], "the uncached read is wrong");
    let c = fs.counters();
    assert_eq!((c.uncached_reads, c.uncached_read_bytes), (1, mb as u64));
    assert_eq!(c.dio_reads, 0, "counted as a direct read");
    assert_eq!(fs.cache_stats().cached_bytes, 0, "the read was cached");
    assert_eq!(c.folio_bytes_mapped, mapped, "the read mapped folios");
    // A small read is cached; a large one over it then reads through the
    // cache, and so does one over data not written back.
    let mut small = foliofs::device::AlignedBuf::zeroed(4096);
    fs.read(ino, 3 * mb as u64, &mut small).unwrap();
    assert!(fs.cache_stats().cached_bytes > 0, "a small read not cached");
    fs.read(ino, 3 * mb as u64, &mut buf).unwrap();
    assert!(buf[..] == data[3 * mb..4 * mb]);
    fs.write(ino, 5 * mb as u64 + 10, &[0xee; 100]).unwrap();
    fs.read(ino, 5 * mb as u64, &mut buf).unwrap();
    assert_eq!(&buf[10..110], &[0xee; 100][..], "dirty data not read");
    assert!(buf[110..] == data[5 * mb + 110..6 * mb]);
    let mut plain = vec![0u8; mb + 1];
    let unaligned = &mut plain[1..];
    fs.read(ino, 6 * mb as u64, unaligned).unwrap();
    assert!(unaligned[..] == data[6 * mb..7 * mb]);
    assert_eq!(fs.counters().uncached_reads, 1, "{:?}", fs.counters());
    // The blocks past the cache are checked as any read's are.
    let block = fs.block_at(ino, mb as u64 + 8192).unwrap().unwrap();
    dev.poke(block * fs.block_size() + 5, &[0]);
    match fs.read(ino, mb as u64, &mut buf) {
        Err(foliofs::Error::DataChecksum {
            ino: i,
            offset,
            addr,
        }) => {
            assert_eq!((i, offset, addr), (ino, mb as u64 + 8192, block));
        }
        r => panic!("a corrupt block past the cache read as {r:?}"),
    }
    assert_eq!(fs.counters().uncached_reads, 2);
    dev.poke(block * fs.block_size() + 5, &data[mb + 8192 + 5..][..1]);
    fs.unmount().unwrap();
    fsck_clean(dev.clone(), "after unmount");
    // Without drop-behind (the engine's default) a large read is cached.
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    fs.read(ino, mb as u64, &mut buf).unwrap();
    assert!(buf[..] == data[mb..2 * mb]);
    assert_eq!(fs.counters().uncached_reads, 0);
    assert!(fs.cache_stats().cached_bytes >= mb as u64);
    unmount_and_check(fs, dev);
}

/// Bytes written back, polled until at least `want` or `limit` passes.
fn written_back_within(fs: &Fs, want: u64, limit: Duration) -> u64 {
    let t = Instant::now();
    loop {
        let n = fs.counters().bytes_written_back;
        if n >= want || t.elapsed() > limit {
            return n;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Write-behind: a sequential writer's whole folios behind it go to the
/// device far below the background threshold, while the folio it is
/// filling stays dirty; a writer that jumps about, or one with the knob
/// off, leaves its data dirty until fsync.
#[test]
fn write_behind_writes_a_sequential_stream_behind_its_writer() {
    let opts = |write_behind_bytes| MountOptions {
        // No periodic pass and a background threshold far above the
        // data: only write-behind can write anything back.
        writeback_interval_ms: 0,
        dirty_limit_bytes: 1 << 30,
        write_behind_bytes,
        ..Default::default()
    };
    let mib = vec![5u8; 1 << 20];
    let (dev, fs) = fresh(256 << 20, opts(4 << 20));
    let f = fs.create(fs.root_ino(), b"stream", 0o644, 0, 0).unwrap();
    for i in 0..24u64 {
        fs.write(f.ino, i << 20, &mib).unwrap();
    }
    // Half a folio more: the writer is in the middle of a 2 MiB folio.
    fs.write(f.ino, 24 << 20, &mib).unwrap();
    let done = written_back_within(&fs, 16 << 20, Duration::from_secs(20));
    assert!(done >= 16 << 20, "only {done} bytes written behind");
    // Settle, then: never the folio being filled.
    std::thread::sleep(Duration::from_millis(100));
    let st = fs.cache_stats();
    assert!(st.dirty_bytes >= 1 << 20, "{st:?}");
    assert!(fs.counters().bytes_written_back <= 24 << 20);
    fs.fsync(f.ino, false).unwrap();
    // The stream's data stays whole: one extent (and the speculative
    // range past EOF, mapped unwritten, after it).
    let e = fs.extents(f.ino).unwrap();
    assert_eq!(e.iter().filter(|e| !e.unwritten).count(), 1, "{e:?}");
    unmount_and_check(fs, dev);

    // Jumping about, further each time than a stream's writes arrive
    // out of order (16 MiB): nothing is written behind.
    let (dev, fs) = fresh(256 << 20, opts(4 << 20));
    let f = fs.create(fs.root_ino(), b"random", 0o644, 0, 0).unwrap();
    for i in 0..48u64 {
        fs.write(f.ino, ((i * 37) % 96) << 20, &mib).unwrap();
    }
    assert_eq!(written_back_within(&fs, 1, Duration::from_millis(300)), 0);
    unmount_and_check(fs, dev);

    // The knob off: nothing either.
    let (dev, fs) = fresh(256 << 20, opts(0));
    let f = fs.create(fs.root_ino(), b"stream", 0o644, 0, 0).unwrap();
    for i in 0..24u64 {
        fs.write(f.ino, i << 20, &mib).unwrap();
    }
    assert_eq!(written_back_within(&fs, 1, Duration::from_millis(300)), 0);
    unmount_and_check(fs, dev);
}

/// Through the mount a stream's writes arrive out of order (the kernel's
/// writeback requests finish on several ring threads): a write near the
/// furthest one still continues the stream, so write-behind keeps up with
/// it, and leaves alone a folio near the writer that a write still on its
/// way will fill.
#[test]
fn write_behind_follows_a_stream_whose_writes_arrive_out_of_order() {
    let opts = MountOptions {
        writeback_interval_ms: 0,
        dirty_limit_bytes: 1 << 30,
        write_behind_bytes: 4 << 20,
        ..Default::default()
    };
    let (dev, fs) = fresh(256 << 20, opts);
    let f = fs.create(fs.root_ino(), b"stream", 0o644, 0, 0).unwrap();
    let mib = |i: u64| vec![i as u8 + 1; 1 << 20];
    // 40 MiB in 1 MiB writes, each 8 MiB window backwards, and MiB 35
    // held back: nothing at or past it may be written behind, nor the
    // rest of a folio it is part of.
    let order: Vec<u64> = (0..5u64)
        .flat_map(|w| (0..8u64).rev().map(move |i| w * 8 + i))
        .filter(|&i| i != 35)
        .collect();
    for &i in &order {
        fs.write(f.ino, i << 20, &mib(i)).unwrap();
    }
    let done = written_back_within(&fs, 16 << 20, Duration::from_secs(20));
    assert!(done >= 16 << 20, "only {done} bytes written behind");
    std::thread::sleep(Duration::from_millis(100));
    let behind = fs.counters().bytes_written_back;
    assert!(
        behind <= 35 << 20,
        "{behind} bytes written: MiB 35 is still to come"
    );
    fs.write(f.ino, 35 << 20, &mib(35)).unwrap();
    fs.fsync(f.ino, false).unwrap();
    let e = fs.extents(f.ino).unwrap();
    assert_eq!(e.iter().filter(|e| !e.unwritten).count(), 1, "{e:?}");
    let mut got = vec![0u8; 1 << 20];
    for i in 0..40u64 {
        assert_eq!(fs.read(f.ino, i << 20, &mut got).unwrap(), 1 << 20);
        assert!(got == mib(i), "MiB {i}");
    }

    // The file truncated and written again the same way (cp over it):
    // what writeback took of the first stream does not hide the gap.
    let cut = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    fs.setattr(f.ino, &cut).unwrap();
    let before = fs.counters().bytes_written_back;
    for &i in &order {
        fs.write(f.ino, i << 20, &mib(i)).unwrap();
    }
    let done = written_back_within(&fs, before + (16 << 20), Duration::from_secs(20));
    assert!(
        done >= before + (16 << 20),
        "only {} bytes written behind",
        done - before
    );
    std::thread::sleep(Duration::from_millis(100));
    let behind = fs.counters().bytes_written_back - before;
    assert!(
        behind <= 35 << 20,
        "{behind} bytes written: MiB 35 is still to come"
    );
    fs.write(f.ino, 35 << 20, &mib(35)).unwrap();
    fs.fsync(f.ino, false).unwrap();
    for i in 0..40u64 {
        assert_eq!(fs.read(f.ino, i << 20, &mut got).unwrap(), 1 << 20);
        assert!(got == mib(i), "MiB {i}");
    }
    unmount_and_check(fs, dev);
}

/// A large write past EOF makes its folio a whole max-size one (into the
/// blocks past EOF, which read as nothing and then as zeros once the file
/// reaches them); a large write inside the file does not grow its folio.
#[test]
fn large_appending_writes_fill_whole_max_size_folios() {
    let (dev, fs) = fresh(128 << 20, MountOptions::default());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap();
    let mib: Vec<u8> = (0..1u32 << 20).map(|i| (i % 241) as u8).collect();
    fs.write(f.ino, 0, &mib).unwrap();
    let st = fs.cache_stats();
    assert_eq!((st.folios, st.largest_folio_bytes), (1, 2 << 20), "{st:?}");
    let mut buf = vec![9u8; 4096];
    assert_eq!(fs.read(f.ino, 1 << 20, &mut buf).unwrap(), 0);
    // A small write further into the grown folio: the gap reads as zeros.
    let at = (3 << 19) + 100;
    fs.write(f.ino, at, b"tail").unwrap();
    assert_eq!(fs.cache_stats().folios, 1);
    let mut got = vec![9u8; at as usize + 4];
    assert_eq!(fs.read(f.ino, 0, &mut got).unwrap(), got.len());
    assert!(got[..1 << 20] == mib[..]);
    assert!(got[1 << 20..at as usize].iter().all(|&b| b == 0));
    assert_eq!(&got[at as usize..], b"tail");
    for i in 1..4u64 {
        fs.write(f.ino, i << 20, &mib).unwrap();
    }
    let st = fs.cache_stats();
    assert_eq!((st.folios, st.cached_bytes), (2, 4 << 20), "{st:?}");
    // Inside the file: a 1 MiB overwrite of a new range gets a 1 MiB folio.
    let g = fs.create(fs.root_ino(), b"g", 0o644, 0, 0).unwrap();
    fs.fallocate(g.ino, Falloc::Allocate { keep_size: false }, 0, 8 << 20)
        .unwrap();
    let before = fs.cache_stats().cached_bytes;
    fs.write(g.ino, 4 << 20, &mib).unwrap();
    assert_eq!(fs.cache_stats().cached_bytes - before, 1 << 20);
    fs.fsync(f.ino, false).unwrap();
    fs.fsync(g.ino, false).unwrap();
    let mut back = vec![0u8; 1 << 20];
    fs.read(f.ino, 3 << 20, &mut back).unwrap();
    assert!(back == mib);
    unmount_and_check(fs, dev);
}

/// sync writes many small files back together: their blocks, allocated
/// one after another, reach the device in a few large writes rather than
/// one write per file, and every byte reads back after a remount.
#[test]
fn sync_writes_many_small_files_in_few_device_writes() {
    let opts = MountOptions {
        writeback_interval_ms: 0,
        ..MountOptions::default()
    };
    let (dev, fs) = fresh(256 << 20, opts.clone());
    let root = fs.root_ino();
    let files = 300u64;
    write_small_files(&fs, root, 0..files, |_| {});
    let before = fs.counters();
    fs.sync().unwrap();
    let after = fs.counters();
    let writes = after.data_device_writes - before.data_device_writes;
    let bytes = after.bytes_written_back - before.bytes_written_back;
    let blocks: u64 = (0..files)
        .map(|i| (small_file(i).len() as u64).div_ceil(4096))
        .sum();
    assert_eq!(bytes, blocks * 4096, "every dirty block written once");
    assert!(
        writes * 10 <= files,
        "{writes} device writes for {files} small files"
    );
    fs.unmount().unwrap();
    let fs = Fs::mount(dev.clone(), opts).unwrap();
    check_small_files(&fs, root, 0..files);
    unmount_and_check(fs, dev);
}

/// The writeback contexts write small files that fall due together as
/// one batch (as sync does): a few device writes, not one per file.
#[test]
fn periodic_writeback_writes_small_files_due_together_in_few_device_writes() {
    let opts = MountOptions {
        writeback_interval_ms: 20,
        dirty_expire_ms: 200,
        ..MountOptions::default()
    };
    let (dev, fs) = fresh(256 << 20, opts);
    let root = fs.root_ino();
    let files = 300u64;
    let before = fs.counters();
    write_small_files(&fs, root, 0..files, |_| {});
    let blocks: u64 = (0..files)
        .map(|i| (small_file(i).len() as u64).div_ceil(4096))
        .sum();
    let t = Instant::now();
    while fs.counters().bytes_written_back - before.bytes_written_back < blocks * 4096 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "writeback never came"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let writes = fs.counters().data_device_writes - before.data_device_writes;
    assert!(
        writes * 10 <= files,
        "{writes} device writes for {files} small files"
    );
    let free = fs.statfs().unwrap().blocks_free;
    let fs = {
        fs.unmount().unwrap();
        Fs::mount(dev.clone(), MountOptions::default()).unwrap()
    };
    assert_eq!(fs.statfs().unwrap().blocks_free, free);
    check_small_files(&fs, root, 0..files);
    unmount_and_check(fs, dev);
}

/// `block_at` (FIBMAP) answers as the whole extent map does, for every
/// block of a fragmented file with a hole and unwritten extents, and
/// writes back first: a block written but still cached is mapped.
#[test]
fn block_at_agrees_with_the_extent_map() {
    let (dev, fs) = fresh(256 << 20, MountOptions::default());
    let root = fs.root_ino();
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap();
    let b = fs.create(root, b"b", 0o644, 0, 0).unwrap();
    let bs = fs.block_size();
    // Interleaved durable writes, then holes punched: many extents.
    for i in 0..64u64 {
        for f in [a.ino, b.ino] {
            fs.write(f, i * bs, &vec![i as u8 + 1; bs as usize])
                .unwrap();
            fs.fsync(f, true).unwrap();
        }
    }
    fs.fallocate(a.ino, Falloc::PunchHole, 10 * bs, 5 * bs)
        .unwrap();
    for blk in (41..64).step_by(2) {
        fs.fallocate(a.ino, Falloc::PunchHole, blk * bs, bs)
            .unwrap();
    }
    fs.fallocate(
        a.ino,
        Falloc::ZeroRange { keep_size: false },
        30 * bs,
        4 * bs,
    )
    .unwrap();
    fs.fallocate(
        a.ino,
        Falloc::Allocate { keep_size: true },
        64 * bs,
        16 * bs,
    )
    .unwrap();
    // Cached, not yet written back: block_at writes it back first.
    fs.write(a.ino, 100 * bs, &vec![9; bs as usize]).unwrap();
    assert!(fs.block_at(a.ino, 100 * bs + 17).unwrap().is_some());
    let ext = fs.extents(a.ino).unwrap();
    assert!(ext.len() > 15, "fragmented: {} extents", ext.len());
    let mut mapped = 0;
    for blk in 0..128u64 {
        let at = blk * bs + blk % bs;
        let want = ext
            .iter()
            .find(|e| !e.unwritten && e.offset <= at && at < e.offset + e.blocks * bs)
            .map(|e| e.device_block + (at - e.offset) / bs);
        assert_eq!(fs.block_at(a.ino, at).unwrap(), want, "block {blk}");
        mapped += u64::from(want.is_some());
    }
    // 64 written, less 5 + 12 punched and 4 zeroed; the unwritten 16 are
    // not; the block at 100.
    assert_eq!(mapped, 64 - 5 - 12 - 4 + 1);
    assert_eq!(fs.block_at(root, 0).unwrap(), None);
    unmount_and_check(fs, dev);
}

/// Overlapping buffered writes over holes with a small cache, writeback
/// threads running beside them: every reservation is used or given back
/// by unmount (the fuzzer's ops_model found 14 blocks left reserved, in
/// one run of a few thousand).
#[test]
fn reservations_balance_when_writeback_races_overlapping_writes() {
    let opts = || MountOptions {
        cache_bytes: 1 << 20,
        dirty_limit_bytes: 256 << 10,
        writeback_interval_ms: 0,
        ..Default::default()
    };
    for round in 0..400 {
        let (dev, fs) = fresh(8 << 20, opts());
        let ino = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
        for (k, (off, len)) in [
            (236_032u64, 49_105usize),
            (524_287, 53_249),
            (327_935, 65_536),
            (508_624, 65_536),
        ]
        .into_iter()
        .enumerate()
        {
            fs.write(ino, off, &vec![k as u8 + 1; len]).unwrap();
            if let Err(e) = fs.check_invariants() {
                panic!("round {round}, write {k} ({off}+{len}): {e}");
            }
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fs.unmount()));
        assert!(matches!(r, Ok(Ok(()))), "round {round}: unmount failed");
        fsck_clean(dev, "after unmount");
    }
}

/// Writeback turning a run of an unwritten extent into a written one
/// unmaps nothing: a later write into the same extent needs no mapping
/// lookup (the inode's mapping hint and change count survive it).
#[test]
fn marking_blocks_written_keeps_the_mapping_hint() {
    let (dev, fs) = fresh(64 << 20, MountOptions::default());
    let a = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap();
    fs.fallocate(a.ino, Falloc::Allocate { keep_size: false }, 0, 1 << 20)
        .unwrap();
    fs.write(a.ino, 0, &[1; 4096]).unwrap();
    fs.fsync(a.ino, true).unwrap();
    let before = fs.counters().mapping_lookups;
    fs.write(a.ino, 10 * 4096, &[2; 4096]).unwrap();
    assert_eq!(
        fs.counters().mapping_lookups - before,
        0,
        "a write into the extent the last write saw looked its mapping up"
    );
    unmount_and_check(fs, dev.clone());
}

/// Options under which dirty data stays dirty: a page cache of `cache`
/// bytes, a dirty limit of `dirty`, no periodic writeback.
fn held_dirty(cache: u64, dirty: u64) -> MountOptions {
    MountOptions {
        cache_bytes: cache,
        dirty_limit_bytes: dirty,
        writeback_interval_ms: 0,
        ..Default::default()
    }
}

/// `n` new files of one byte in `dir`, all still dirty afterwards.
fn one_byte_files(fs: &Fs, dir: u64, n: u64) {
    for i in 0..n {
        let a = fs
            .create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write(a.ino, 0, b"x").unwrap();
    }
    let dirty = fs.cache_stats().dirty_bytes;
    assert!(dirty >= n * 4096, "{dirty} bytes dirty after {n} files");
}

#[test]
fn inodes_loaded_while_most_in_memory_are_dirty_are_not_each_a_full_pass() {
    // More dirty files than the inodes kept in memory (65,536), none
    // written back: a pass can let go of none of them, and the cold
    // inodes looked up after them must not each walk them all again.
    let opts = held_dirty(2 << 30, 1 << 30);
    let (dev, fs) = fresh(2 << 30, opts.clone());
    let cold = fs.mkdir(fs.root_ino(), b"cold", 0o755, 0, 0).unwrap().ino;
    for i in 0..2_000 {
        fs.create(cold, format!("c{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
    }
    fs.unmount().unwrap();
    let fs = Fs::mount(dev.clone(), opts).unwrap();
    let cold = fs.lookup(fs.root_ino(), b"cold").unwrap().ino;
    let hot = fs.mkdir(fs.root_ino(), b"hot", 0o755, 0, 0).unwrap().ino;
    one_byte_files(&fs, hot, 70_000);
    let trims0 = fs.counters().inode_trims;
    for i in 0..2_000 {
        fs.lookup(cold, format!("c{i}").as_bytes()).unwrap();
    }
    let trims = fs.counters().inode_trims - trims0;
    assert!(trims <= 1, "{trims} passes over the inodes for 2,000 loads");
    fs.sync().unwrap();
    unmount_and_check(fs, dev);
}

#[test]
fn a_cache_full_of_dirty_folios_is_not_scanned_for_every_new_folio() {
    // A dirty limit above the page cache's: 20,000 small dirty files
    // (80 MB of folios) in a 16 MiB cache. Nothing can be evicted, and
    // each new folio must not walk all the others to find that out.
    let (dev, fs) = fresh(1 << 30, held_dirty(16 << 20, 1 << 30));
    let d = fs.mkdir(fs.root_ino(), b"d", 0o755, 0, 0).unwrap().ino;
    one_byte_files(&fs, d, 20_000);
    let scans = fs.counters().cache_scans;
    assert!(scans <= 50, "{scans} eviction scans for 20,000 folios");
    fs.sync().unwrap();
    unmount_and_check(fs, dev);
}

#[test]
fn a_file_of_many_extents_seeks_and_truncates_exactly() {
    // A block written, then one skipped, 3,000 times: writeback maps the
    // skipped blocks unwritten between them, so 5,999 one-block extents
    // and the preallocated tail (taken from the end a batch at a time).
    // Cut inside a written block, at an unwritten one's start, inside an
    // unwritten one, and to nothing.
    let (dev, fs, bs, a) = fresh_with_file(256 << 20);
    let free0 = fs.statfs().unwrap().blocks_free;
    for i in 0..3_000u64 {
        fs.write(a, 2 * i * bs, &vec![i as u8 | 1; bs as usize])
            .unwrap();
        if i % 500 == 499 {
            fs.fsync(a, false).unwrap();
        }
    }
    fs.fsync(a, false).unwrap();
    let ext = fs.extents(a).unwrap();
    assert_eq!(ext.len(), 6_000);
    let odd: Vec<_> = ext
        .iter()
        .enumerate()
        .filter(|(b, e)| *b < 5_999 && (e.blocks != 1 || e.unwritten != (b % 2 == 1)))
        .take(4)
        .collect();
    assert!(odd.is_empty(), "not one written, one unwritten: {odd:?}");
    // SEEK_DATA finds each written block (unwritten ones read as holes),
    // SEEK_HOLE the block after it.
    let (mut pos, mut data) = (0, Vec::new());
    while let Some(d) = fs.seek(a, pos, Whence::Data).unwrap() {
        pos = fs.seek(a, d, Whence::Hole).unwrap().unwrap();
        data.push((d / bs, pos / bs));
    }
    let want: Vec<_> = (0..3_000u64).map(|i| (2 * i, 2 * i + 1)).collect();
    assert!(
        data == want,
        "data segments: {:?}...",
        &data[..data.len().min(4)]
    );
    for size in [5_000 * bs + 100, 4_001 * bs, 1_000 * bs + 1, 0] {
        let set = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(a, &set).unwrap();
        let ext = fs.extents(a).unwrap();
        // Block b is kept if any of it lies below the size, in an extent
        // of its own.
        let kept = (0..6_000u64).filter(|b| b * bs < size).count();
        assert_eq!(ext.len(), kept, "extents after truncating to {size}");
        let bad: Vec<_> = ext
            .iter()
            .filter(|e| e.blocks != 1 || e.offset >= size)
            .collect();
        assert!(bad.is_empty(), "after truncating to {size}: {bad:?}");
        // The blocks, and the extent tree's nodes (at most 128 for 6,000
        // extents), once the frees are committed.
        fs.sync().unwrap();
        let held = free0 - fs.statfs().unwrap().blocks_free;
        assert!(
            held >= kept as u64 && held <= kept as u64 + 128,
            "{held} blocks held for {kept} kept"
        );
    }
    unmount_and_check(fs, dev);
}

#[test]
fn fallocate_maps_the_holes_around_dirty_blocks_and_refuses_what_cannot_fit() {
    let (dev, fs, bs, a) = fresh_with_file(64 << 20);
    // Dirty, not yet mapped: blocks 3, 4 and 10 of the range.
    for b in [3u64, 4, 10] {
        fs.write(a, b * bs, &vec![b as u8; bs as usize]).unwrap();
    }
    let free0 = fs.statfs().unwrap().blocks_free;
    // Far more than the image holds: refused, nothing taken (trying
    // gives back speculative preallocation).
    let huge = Falloc::Allocate { keep_size: false };
    assert!(matches!(
        fs.fallocate(a, huge, 0, 1 << 40),
        Err(foliofs::Error::NoSpace)
    ));
    assert!(fs.statfs().unwrap().blocks_free >= free0);
    fs.fallocate(a, Falloc::Allocate { keep_size: false }, 0, 16 * bs)
        .unwrap();
    fs.check_invariants().unwrap();
    // The holes 0-2, 5-9 and 11-15 are mapped unwritten; the dirty
    // blocks keep their reservations and are mapped at writeback.
    let unwritten: Vec<(u64, u64)> = fs
        .extents(a)
        .unwrap()
        .iter()
        .filter(|e| e.unwritten)
        .map(|e| (e.offset / bs, e.blocks))
        .collect();
    let blocks: u64 = unwritten.iter().map(|&(_, n)| n).sum();
    assert_eq!(blocks, 13, "unwritten extents {unwritten:?}");
    assert!(unwritten
        .iter()
        .all(|&(o, n)| (o..o + n).all(|b| ![3, 4, 10].contains(&b))));
    fs.fsync(a, false).unwrap();
    let mut buf = vec![0u8; bs as usize];
    for b in 0..16u64 {
        assert_eq!(fs.read(a, b * bs, &mut buf).unwrap(), bs as usize);
        let want = if [3, 4, 10].contains(&b) { b as u8 } else { 0 };
        assert!(buf.iter().all(|&x| x == want), "block {b}");
    }
    unmount_and_check(fs, dev);
}

/// Counts of the bytes read and the reads in flight at once; each read
/// takes a while once `slow` is set, so that readers meet.
#[derive(Default)]
struct WatchedReads {
    slow: std::sync::atomic::AtomicBool,
    bytes: std::sync::atomic::AtomicU64,
    now: std::sync::atomic::AtomicU64,
    peak: std::sync::atomic::AtomicU64,
}

impl Hooks for WatchedReads {
    fn read(&self, len: usize, io: &mut dyn FnMut() -> std::io::Result<()>) -> std::io::Result<()> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        if self.slow.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.bytes.fetch_add(len as u64, Ordering::SeqCst);
        let r = io();
        self.now.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

/// Buffered reads of what is not cached read the device without the
/// metadata lock: readers of different parts of a file read at once,
/// and readers of the same folio wait for one fill instead of each
/// reading it (the FUSE mount's request threads serve the kernel's
/// read-ahead of one stream so).
#[test]
fn cold_buffered_readers_read_the_device_at_once_and_share_fills() {
    const MIB: usize = 1 << 20;
    const FILE: usize = 16 * MIB;
    const CHUNK: usize = 128 << 10;
    let mem = Arc::new(MemDevice::new(256 << 20));
    mkfs(&*mem, &MkfsOptions::default(), |_, _| {}).unwrap();
    let dev = Arc::new(Hooked {
        mem,
        hooks: WatchedReads::default(),
    });
    let byte = |at: usize| (at / 4096 * 7 + at % 251) as u8;
    let data: Vec<u8> = (0..FILE).map(byte).collect();
    let ino = {
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let ino = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &data).unwrap();
        fs.fsync(ino, false).unwrap();
        fs.unmount().unwrap();
        ino
    };
    // Each phase on a fresh mount, so nothing of the file is cached.
    let phase = |chunks_of: fn(usize, usize) -> Vec<usize>| {
        let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
        fs.getattr(ino).unwrap();
        dev.slow.store(true, Ordering::SeqCst);
        dev.bytes.store(0, Ordering::SeqCst);
        dev.peak.store(0, Ordering::SeqCst);
        let start = Arc::new(std::sync::Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (fs, start) = (fs.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let mut buf = vec![0u8; CHUNK];
                    for c in chunks_of(t, FILE / CHUNK) {
                        let at = c * CHUNK;
                        assert_eq!(fs.read(ino, at as u64, &mut buf).unwrap(), CHUNK);
                        let want: Vec<u8> = (at..at + CHUNK).map(byte).collect();
                        assert!(buf == want, "chunk {c} read back wrong");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        dev.slow.store(false, Ordering::SeqCst);
        let fs = Arc::try_unwrap(fs).ok().unwrap();
        fs.unmount().unwrap();
        (
            dev.bytes.load(Ordering::SeqCst),
            dev.peak.load(Ordering::SeqCst),
        )
    };
    // A quarter of the file each: four streams, read at once.
    let (_, peak) = phase(|t, n| (t * n / 4..(t + 1) * n / 4).collect());
    assert!(peak >= 2, "the readers of four streams read one at a time");
    // The same stream on every thread, a chunk each in turn: each folio
    // read from the device once (the metadata's reads besides).
    let (bytes, _) = phase(|t, n| (t..n).step_by(4).collect());
    assert!(
        bytes < (FILE + 2 * MIB) as u64,
        "{} MiB read from the device for a {} MiB file",
        bytes >> 20,
        FILE >> 20
    );
}

/// Holds large device writes (data, not the journal's blocks) while
/// `held` is set, counting those waiting.
#[derive(Default)]
struct HeldWrites {
    held: std::sync::Mutex<bool>,
    freed: std::sync::Condvar,
    waiting: std::sync::atomic::AtomicU64,
}

impl Hooks for HeldWrites {
    fn write(
        &self,
        len: usize,
        io: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if len >= 64 << 10 {
            let mut held = self.held.lock().unwrap();
            self.waiting.fetch_add(1, Ordering::SeqCst);
            while *held {
                held = self.freed.wait(held).unwrap();
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        io()
    }
}

/// SEEK_DATA and SEEK_HOLE while the file's dirty blocks are on their
/// way to the device: no longer dirty, still mapped unwritten until the
/// writeback completes, they are data all the same (seek waits for the
/// writeback). Through the mount, write-behind of a small file written
/// at random made this window common (fsx through the mount).
#[test]
fn seek_finds_data_under_writeback() {
    let mem = Arc::new(MemDevice::new(64 << 20));
    mkfs(&*mem, &MkfsOptions::default(), |_, _| {}).unwrap();
    let dev = Arc::new(Hooked {
        mem,
        hooks: HeldWrites::default(),
    });
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
    let ino = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    // A hole, then 1 MiB of data, then a hole to 4 MiB.
    fs.write(ino, 1 << 20, &vec![7u8; 1 << 20]).unwrap();
    let grow = SetAttr {
        size: Some(4 << 20),
        ..Default::default()
    };
    fs.setattr(ino, &grow).unwrap();
    *dev.held.lock().unwrap() = true;
    let syncer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.fsync(ino, true))
    };
    let t = Instant::now();
    while dev.waiting.load(Ordering::SeqCst) == 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "no data write held");
        std::thread::sleep(Duration::from_millis(1));
    }
    let seeker = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            (
                fs.seek(ino, 0, Whence::Data).unwrap(),
                fs.seek(ino, 1 << 20, Whence::Hole).unwrap(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    *dev.held.lock().unwrap() = false;
    dev.freed.notify_all();
    assert_eq!(seeker.join().unwrap(), (Some(1 << 20), Some(2 << 20)));
    syncer.join().unwrap().unwrap();
    assert_eq!(fs.seek(ino, 0, Whence::Data).unwrap(), Some(1 << 20));
}

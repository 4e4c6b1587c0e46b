//! Crash consistency (the harness is `foliofs::torture`): random
//! workloads from every path on the crash-recording device, cut after
//! every flush with dropped, reordered and torn writes; each state must
//! mount, read back both ways without a checksum error, keep every fsynced
//! byte, hold no byte its file was never given, and pass fsck.
//!
//! FOLIOFS_CRASH_STATES (default 1,200) and FOLIOFS_SEED control the run;
//! a failure prints its seed and how to replay it.

use foliofs::device::{AlignedBuf, MemDevice};
use foliofs::fs::*;
use foliofs::torture::crash_round;
use foliofs::Fs;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::Arc;

mod common;
use common::{check_small_files, crash_fs, env_u64, fsck_clean, write_small_files};

/// Cut power before every flush of `log` (two torn variants each): every
/// state mounts, unmounts and passes fsck. Returns the last state's image.
fn mount_every_cut(log: &foliofs::device::CrashLog, seed: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut last = None;
    log.for_each_cut(2, &mut rng, |e, img| {
        let d = Arc::new(MemDevice::from_image(img.clone()));
        let fs = Fs::mount(d.clone(), MountOptions::default())
            .unwrap_or_else(|err| panic!("mount after epoch {e}: {err}"));
        fs.unmount().unwrap();
        fsck_clean(d, &format!("crash before flush {e}"));
        if e + 1 == log.epochs.len() {
            last = Some(img);
        }
    });
    last.expect("no flush recorded")
}

#[test]
fn crash_at_every_flush_with_torn_writes() {
    let seed = env_u64("FOLIOFS_SEED", 7);
    let want = env_u64("FOLIOFS_CRASH_STATES", 1200);
    let (mut states, mut rounds) = (0u64, 0u64);
    while states < want {
        let r =
            crash_round(seed.wrapping_add(rounds), 400, 6, || {}).unwrap_or_else(|f| panic!("{f}"));
        assert!(
            r.epochs > 10,
            "a workload of {} ops flushed only {} times",
            r.ops,
            r.epochs
        );
        states += r.states;
        rounds += 1;
    }
    eprintln!("checked {states} crash states in {rounds} rounds");
}

/// fdatasync of a small overwrite costs one flush: the block and its
/// checksum go into the journal together (the checksum block itself only
/// when the live log holds no image of it yet), one write and one flush, and
/// the home location is written later by a checkpoint. A crash at every
/// flush (torn writes included) reads back without a checksum error, keeps
/// every acknowledged overwrite, and leaves no block unverified (fsck
/// --data); so does the last state after checkpoints wrote blocks home.
#[test]
fn fdatasync_of_an_overwrite_flushes_once_and_survives_a_crash() {
    let (dev, fs) = crash_fs(16 << 20);
    // Only this thread commits (no periodic commit); background
    // checkpoints flush too, counted apart.
    fs.unmount().unwrap();
    let opts = MountOptions {
        writeback_interval_ms: 3_600_000,
        ..Default::default()
    };
    let fs = Fs::mount(dev.clone(), opts).unwrap();
    let own_flushes = |fs: &Fs| {
        let j = fs.counters().journal;
        j.flushes - j.checkpoint_flushes + j.data_flushes
    };
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap();
    let mut want = vec![7u8; 256 << 10];
    fs.write(f.ino, 0, &want).unwrap();
    fs.fsync(f.ino, false).unwrap();
    let c0 = fs.counters();
    for i in 0..400u64 {
        let at = ((i * 37) % 64) * 4096;
        let block = vec![100 + (i % 100) as u8; 4096];
        fs.write(f.ino, at, &block).unwrap();
        want[at as usize..at as usize + 4096].copy_from_slice(&block);
        let f0 = own_flushes(&fs);
        fs.fsync(f.ino, true).unwrap();
        assert_eq!(own_flushes(&fs) - f0, 1, "flushes for fdatasync {i}");
        if i % 50 == 0 {
            // The newest data comes from the log until it is home.
            let mut got = AlignedBuf::zeroed(want.len());
            fs.read_direct(f.ino, 0, &mut got).unwrap();
            assert!(got[..] == want[..], "direct read after overwrite {i}");
        }
    }
    let c = fs.counters();
    assert_eq!(c.datasync_flush_only, c0.datasync_flush_only);
    assert_eq!(c.overwrite_intents, c0.overwrite_intents);
    assert_eq!(
        c.overwrite_logged_bytes - c0.overwrite_logged_bytes,
        400 * 4096
    );
    assert!(
        c.journal.data_home_blocks > c0.journal.data_home_blocks,
        "no checkpoint wrote logged blocks home"
    );
    // The file's checksums sit in one checksum block: imaged by the first
    // commit after each checkpoint, left to replay to derive from the
    // logged data in the others (every cut below replays some of those).
    let implied = c.journal.csum_blocks_implied - c0.journal.csum_blocks_implied;
    let commits = c.journal.commits - c0.journal.commits;
    assert!(
        implied * 2 > commits,
        "checksum blocks left out of only {implied} of {commits} commits"
    );
    let log = dev.log();
    drop(fs);
    let d = Arc::new(MemDevice::from_image(mount_every_cut(&log, 1)));
    let fs = Fs::mount(d.clone(), MountOptions::default()).unwrap();
    let mut got = vec![0u8; want.len()];
    assert_eq!(fs.read(f.ino, 0, &mut got).unwrap(), want.len());
    assert!(got == want, "acknowledged overwrites lost");
    fs.unmount().unwrap();
    let r = fsck_clean(d, "after the cut");
    assert_eq!(r.data_blocks_unverified, 0);
}

/// fdatasyncs from several threads at once, committed in groups (a
/// committer waits for the others to join; the last to join seals and
/// writes the transaction and wakes the rest when it is written): after a
/// crash at every flush, torn writes included, every overwrite a thread saw
/// acknowledged is there, whole and verified.
#[test]
fn fdatasyncs_committed_in_groups_each_survive_a_crash() {
    const THREADS: u64 = 3;
    const SLOTS: u64 = 8;
    const VERSIONS: u64 = 64;
    let (dev, fs) = crash_fs(16 << 20);
    // Flushes that take a millisecond, as a disk's do: the others come to
    // commit while one is flushing, so groups form.
    dev.faults
        .flush_delay_us
        .store(1000, std::sync::atomic::Ordering::SeqCst);
    // Version v of thread t's block: v in its first 8 bytes, a pattern
    // of both after them; it goes to slot v % SLOTS.
    let block = |t: u64, v: u64| {
        let mut b = vec![(t * 31 + v) as u8 | 1; 4096];
        b[..8].copy_from_slice(&v.to_le_bytes());
        b
    };
    let name = |t: u64| format!("t{t}");
    let inos: Vec<u64> = (0..THREADS)
        .map(|t| {
            let a = fs.create(fs.root_ino(), name(t).as_bytes(), 0o644, 0, 0);
            a.unwrap().ino
        })
        .collect();
    let waits0 = fs.counters().commit_batch_waits;
    // Per thread: (version, flushes completed when its fdatasync returned).
    let acks: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (fs, dev, ino) = (&fs, &dev, inos[t as usize]);
                s.spawn(move || {
                    let mut acks = Vec::new();
                    for v in 0..VERSIONS {
                        fs.write(ino, (v % SLOTS) * 4096, &block(t, v)).unwrap();
                        fs.fsync(ino, true).unwrap();
                        acks.push((v, dev.flush_count()));
                    }
                    acks
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        fs.counters().commit_batch_waits > waits0,
        "no committer waited for a group: the path under test never ran"
    );
    let log = dev.log();
    drop(fs);
    let mut rng = SmallRng::seed_from_u64(33);
    let mut checked = 0;
    log.for_each_cut(2, &mut rng, |e, img| {
        let fs = Fs::mount(
            Arc::new(MemDevice::from_image(img)),
            MountOptions::default(),
        )
        .unwrap_or_else(|err| panic!("mount after flush {e}: {err}"));
        for t in 0..THREADS {
            // The newest version of each slot acknowledged by then: a
            // fdatasync that returned after n flushes is durable once n
            // flushes are.
            let mut need = [None; SLOTS as usize];
            for &(v, n) in &acks[t as usize] {
                if n <= e as u64 {
                    need[(v % SLOTS) as usize] = Some(v);
                }
            }
            if need.iter().all(Option::is_none) {
                continue;
            }
            let ino = fs.lookup(fs.root_ino(), name(t).as_bytes()).unwrap().ino;
            for (slot, want) in need.iter().enumerate() {
                let Some(want) = *want else { continue };
                let mut got = vec![0u8; 4096];
                let n = fs.read(ino, slot as u64 * 4096, &mut got).unwrap();
                assert_eq!(n, 4096, "thread {t} slot {slot} after flush {e}");
                let v = u64::from_le_bytes(got[..8].try_into().unwrap());
                assert!(
                    v >= want && v % SLOTS == slot as u64 && got == block(t, v),
                    "thread {t} slot {slot} after flush {e}: version {v}, acknowledged {want}"
                );
            }
            checked += 1;
        }
        fs.unmount().unwrap();
    });
    assert!(checked > 0, "no cut held an acknowledged overwrite");
}

/// Direct overwrites, small (logged) and large (written out of place),
/// racing direct readers of the same blocks: every read is verified and
/// sees whole writes (each 4 KiB block holds one writer's pattern), and
/// after a crash at every flush fsck --data finds every block verified.
#[test]
fn direct_overwrites_logged_and_out_of_place_read_back_verified() {
    let (dev, fs) = crash_fs(32 << 20);
    let f = fs.create(fs.root_ino(), b"d", 0o644, 0, 0).unwrap();
    let size = 2usize << 20;
    let mut buf = AlignedBuf::zeroed(size);
    buf.fill(1);
    fs.write_direct(f.ino, 0, &buf).unwrap();
    fs.fsync(f.ino, false).unwrap();
    let fs = Arc::new(fs);
    let writers: Vec<_> = (0..2u8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                for i in 0..60usize {
                    // Every fourth write is 512 KiB: out of place.
                    let len = if i % 4 == 0 {
                        512 << 10
                    } else {
                        4096 * (1 + i % 3)
                    };
                    let at = ((i * 7919 + t as usize * 104_729) * 4096) % (size - len);
                    let at = at / 4096 * 4096;
                    let mut b = AlignedBuf::zeroed(len);
                    b.fill(10 + t * 100 + (i % 90) as u8);
                    fs.write_direct(f.ino, at as u64, &b).unwrap();
                    if i % 10 == 9 {
                        fs.fsync(f.ino, true).unwrap();
                    }
                }
            })
        })
        .collect();
    let reader = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let mut b = AlignedBuf::zeroed(size);
            for _ in 0..40 {
                fs.read_direct(f.ino, 0, &mut b).unwrap();
                for blk in b.chunks(4096) {
                    assert!(blk.iter().all(|&x| x == blk[0]), "a torn block was read");
                }
            }
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    reader.join().unwrap();
    let c = fs.counters();
    assert!(
        c.overwrite_logged_bytes > 0 && c.overwrite_cow_bytes > 0,
        "{c:?}"
    );
    assert_eq!(c.csum_failures, 0);
    fs.fsync(f.ino, false).unwrap();
    let mut want = AlignedBuf::zeroed(size);
    fs.read_direct(f.ino, 0, &mut want).unwrap();
    let log = dev.log();
    drop(Arc::try_unwrap(fs).ok().unwrap());
    let d = Arc::new(MemDevice::from_image(mount_every_cut(&log, 2)));
    let fs = Fs::mount(d.clone(), MountOptions::default()).unwrap();
    let mut got = AlignedBuf::zeroed(size);
    fs.read_direct(f.ino, 0, &mut got).unwrap();
    assert!(got[..] == want[..], "fsynced direct overwrites lost");
    fs.unmount().unwrap();
    assert_eq!(fsck_clean(d, "after the cut").data_blocks_unverified, 0);
}

/// An unlink's data blocks are reusable as soon as its commit is durable,
/// before any checkpoint; its extent-tree nodes, whose images are still in
/// the journal, wait for the checkpoint (replay would write them over a new
/// owner's data). A crash at every flush, torn writes included, must keep
/// the new file's data intact (fsck checks every data checksum), and the
/// last state must hold all of it.
#[test]
fn blocks_freed_by_an_unlink_are_reused_before_the_checkpoint_and_survive_a_crash() {
    let (dev, fs) = crash_fs(64 << 20);
    let root = fs.root_ino();
    let a = fs.create(root, b"a", 0o644, 0, 0).unwrap();
    // Every other block: thousands of extents, so the mapping takes tree
    // nodes whose images are journaled.
    for i in 0..3000u64 {
        fs.write(a.ino, i * 8192, &[1u8; 4096]).unwrap();
    }
    fs.fsync(a.ino, false).unwrap();
    let old = fs.extents(a.ino).unwrap();
    assert!(old.len() > 1000, "only {} extents", old.len());
    let old_blocks: std::collections::BTreeSet<u64> = old
        .iter()
        .flat_map(|e| e.device_block..e.device_block + e.blocks)
        .collect();
    fs.unlink(root, b"a").unwrap();
    fs.sync().unwrap();
    let checkpoints = fs.counters().journal.checkpoints;
    let b = fs.create(root, b"b", 0o644, 0, 0).unwrap();
    let want: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i / 4096 * 7 + i % 251) as u8)
        .collect();
    fs.write(b.ino, 0, &want).unwrap();
    fs.fsync(b.ino, false).unwrap();
    assert_eq!(
        fs.counters().journal.checkpoints,
        checkpoints,
        "a checkpoint ran: the test would not show reuse before one"
    );
    let reused = fs
        .extents(b.ino)
        .unwrap()
        .iter()
        .flat_map(|e| e.device_block..e.device_block + e.blocks)
        .filter(|p| old_blocks.contains(p))
        .count();
    assert!(reused > 1000, "only {reused} of the freed blocks reused");
    let log = dev.log();
    drop(fs);
    let d = Arc::new(MemDevice::from_image(mount_every_cut(&log, 3)));
    let fs = Fs::mount(d, MountOptions::default()).unwrap();
    let ino = fs.lookup(root, b"b").unwrap().ino;
    let mut got = vec![0u8; want.len()];
    assert_eq!(fs.read(ino, 0, &mut got).unwrap(), want.len());
    assert!(got == want, "fsynced data lost or overwritten");
    fs.unmount().unwrap();
}

/// A closed file unlinked is freed in the unlink's own transaction, off
/// the orphan list, when its extents are inline; one whose extents are a
/// tree is freed in committed steps, on the list. Many unlinks in one
/// transaction that outgrows its half of the journal (so commits fall
/// inside them), a long file among them: at every cut, mount, fsck clean
/// (an inode with no links off the orphan list would be lost for good),
/// and at the end every block and inode is back.
#[test]
fn files_freed_at_their_unlink_leave_no_inode_behind_at_any_cut() {
    // The smallest journal: a transaction commits past 16 blocks.
    let mem = MemDevice::new(32 << 20);
    let opts = MkfsOptions {
        journal_blocks: Some(64),
        ..MkfsOptions::default()
    };
    mkfs(&mem, &opts, |_, _| {}).unwrap();
    let dev = Arc::new(foliofs::device::CrashDevice::new(mem.image()));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let root = fs.root_ino();
    let before = fs.statfs().unwrap();
    let dir = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let n = 1500u64;
    write_small_files(&fs, dir, 0..n, |_| {});
    let long = fs.create(dir, b"long", 0o644, 0, 0).unwrap().ino;
    for i in 0..2000u64 {
        fs.write(long, i * 8192, &[9u8; 4096]).unwrap();
    }
    fs.sync().unwrap();
    assert!(fs.extents(long).unwrap().len() > 1000);
    let commits = fs.counters().journal.commits;
    for i in 0..n {
        fs.unlink(dir, format!("f{i}").as_bytes()).unwrap();
        if i == n / 2 {
            fs.unlink(dir, b"long").unwrap();
        }
    }
    assert!(
        fs.counters().journal.commits > commits + 10,
        "the unlinks committed only {} times",
        fs.counters().journal.commits - commits
    );
    fs.rmdir(root, b"d").unwrap();
    fs.sync().unwrap();
    let log = dev.log();
    drop(fs);
    let d = Arc::new(MemDevice::from_image(mount_every_cut(&log, 11)));
    let fs = Fs::mount(d, MountOptions::default()).unwrap();
    let after = fs.statfs().unwrap();
    assert_eq!(after.files_free, before.files_free, "inodes lost");
    assert_eq!(after.blocks_free, before.blocks_free, "blocks lost");
    fs.unmount().unwrap();
}

/// A file replaced by rename while open lives on as an orphan until its
/// last close; a crash before that close leaves it in the orphan list,
/// and the next mount frees it. At every cut: mount, fsck clean; in the
/// last state, the name holds the new file and the old inode's space is
/// back.
#[test]
fn a_file_replaced_by_rename_while_open_is_freed_after_a_crash() {
    let (dev, fs) = crash_fs(32 << 20);
    let root = fs.root_ino();
    let old = fs.create(root, b"b", 0o644, 0, 0).unwrap();
    fs.write(old.ino, 0, &vec![3u8; 4 << 20]).unwrap();
    let new = fs.create(root, b"a", 0o644, 0, 0).unwrap();
    fs.write(new.ino, 0, b"the new b").unwrap();
    fs.sync().unwrap();
    let free_before = fs.statfs().unwrap().blocks_free;
    fs.open(old.ino).unwrap();
    fs.rename(root, b"a", root, b"b", 0).unwrap();
    // Still open: readable, and its space still held.
    let mut got = vec![0u8; 4096];
    assert_eq!(fs.read(old.ino, 0, &mut got).unwrap(), 4096);
    assert!(got.iter().all(|&b| b == 3));
    assert_eq!(fs.getattr(old.ino).unwrap().nlink, 0);
    fs.sync().unwrap();
    let log = dev.log();
    drop(fs); // the power goes before the last close
    let d = Arc::new(MemDevice::from_image(mount_every_cut(&log, 5)));
    let fs = Fs::mount(d.clone(), MountOptions::default()).unwrap();
    let b = fs.lookup(root, b"b").unwrap();
    assert_eq!(b.ino, new.ino);
    assert!(matches!(fs.getattr(old.ino), Err(foliofs::Error::NotFound)));
    assert!(
        fs.statfs().unwrap().blocks_free >= free_before + 1024 - 8,
        "the replaced file's 4 MiB came back"
    );
    fs.unmount().unwrap();
    fsck_clean(d, "after the orphan was freed");
}

/// Small files written back together, by the writeback contexts as they
/// fall due and by sync (`writeback_many`: many files' blocks in one
/// gathered write): a cut before every flush, torn writes included,
/// mounts and passes fsck, and after the last flush every file reads
/// back whole.
#[test]
fn small_files_written_back_together_survive_a_crash_at_every_flush() {
    let (dev, fs) = crash_fs(32 << 20);
    fs.unmount().unwrap();
    let opts = MountOptions {
        writeback_interval_ms: 10,
        dirty_expire_ms: 30,
        ..Default::default()
    };
    let fs = Fs::mount(dev.clone(), opts).unwrap();
    let root = fs.root_ino();
    let files = 120u64;
    let c0 = fs.counters();
    write_small_files(&fs, root, 0..files, |i| {
        if i % 40 == 39 {
            // The contexts write back what fell due meanwhile.
            std::thread::sleep(std::time::Duration::from_millis(150));
        }
    });
    let background = fs.counters().data_device_writes - c0.data_device_writes;
    assert!(
        background > 0 && background * 4 < files,
        "{background} device writes by the contexts for {files} small files"
    );
    fs.sync().unwrap();
    let log = dev.log();
    drop(fs);
    let d = Arc::new(MemDevice::from_image(mount_every_cut(&log, 3)));
    let fs = Fs::mount(d.clone(), MountOptions::default()).unwrap();
    check_small_files(&fs, root, 0..files);
    fs.unmount().unwrap();
    let r = fsck_clean(d, "after the cut");
    assert_eq!(r.data_blocks_unverified, 0);
}

/// The image a power cut leaves now: every flushed write, none of the
/// ones since the last flush.
fn cut_now(dev: &foliofs::device::CrashDevice) -> Fs {
    let log = dev.log();
    let mut img = log.initial.clone();
    for writes in &log.epochs[..log.epochs.len() - 1] {
        for (off, data) in writes {
            img[*off as usize..*off as usize + data.len()].copy_from_slice(data);
        }
    }
    Fs::mount(
        Arc::new(MemDevice::from_image(img)),
        MountOptions::default(),
    )
    .unwrap()
}

/// A crash-recording file system mounted with `opts` (engine options).
fn crash_fs_with(opts: &str) -> (Arc<foliofs::device::CrashDevice>, Fs) {
    let (dev, fs) = crash_fs(32 << 20);
    fs.unmount().unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::parse(opts).unwrap()).unwrap();
    (dev, fs)
}

/// chattr +S and +D, and the `sync` and `dirsync` mount options: what
/// they make synchronous is durable when the call returns (a power cut
/// right after keeps it), and what they do not cover is not (the cut
/// loses it: the check can fail). New files and directories take the
/// flags from their directory.
#[test]
fn synchronous_updates_are_durable_when_the_call_returns() {
    let gone = |fs: &Fs, dir: u64, name: &[u8]| {
        assert!(matches!(
            fs.lookup(dir, name),
            Err(foliofs::Error::NotFound)
        ));
    };
    let read = |fs: &Fs, ino: u64, n: usize| {
        let mut buf = vec![0u8; n];
        assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), n);
        buf
    };

    // Without: a create and a write are not durable yet.
    let (dev, fs) = crash_fs(32 << 20);
    let root = fs.root_ino();
    let f = fs.create(root, b"plain", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"cached").unwrap();
    gone(&cut_now(&dev), root, b"plain");

    // +D: the directory's entries, and its new subdirectories'.
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    fs.fsync(d, false).unwrap();
    fs.set_flags(d, FL_DIRSYNC, false).unwrap();
    let sub = fs.mkdir(d, b"sub", 0o755, 0, 0).unwrap();
    assert_eq!(sub.flags, FL_DIRSYNC, "a new directory takes dirsync");
    let x = fs.create(sub.ino, b"x", 0o644, 0, 0).unwrap();
    assert_eq!(x.flags, 0, "a new file does not");
    fs.write(x.ino, 0, b"not synchronous").unwrap();
    let after = cut_now(&dev);
    assert_eq!(after.getattr(d).unwrap().flags, FL_DIRSYNC);
    let x2 = after
        .lookup(after.lookup(d, b"sub").unwrap().ino, b"x")
        .unwrap();
    assert_eq!(x2.size, 0, "+D makes the name durable, not the data");
    fs.rename(sub.ino, b"x", d, b"y", 0).unwrap();
    let after = cut_now(&dev);
    gone(&after, after.lookup(d, b"sub").unwrap().ino, b"x");
    after.lookup(d, b"y").unwrap();
    fs.unlink(d, b"y").unwrap();
    gone(&cut_now(&dev), d, b"y");
    // Dirsync is a directory's flag only (ext4 drops it on files).
    assert_eq!(fs.set_flags(f, FL_DIRSYNC, false).unwrap().flags, 0);

    // +S on a directory: its entries, and its new files take +S, whose
    // writes, attribute and xattr changes are durable at once.
    let s = fs.mkdir(root, b"s", 0o755, 0, 0).unwrap().ino;
    fs.fsync(s, false).unwrap();
    fs.set_flags(s, FL_SYNC | FL_NOATIME, false).unwrap();
    let g = fs.create(s, b"g", 0o644, 0, 0).unwrap();
    assert_eq!(g.flags, FL_SYNC | FL_NOATIME, "sync and noatime pass on");
    fs.write(g.ino, 0, b"synchronous").unwrap();
    assert_eq!(read(&cut_now(&dev), g.ino, 11), b"synchronous");
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(g.ino, &chmod).unwrap();
    fs.setxattr(g.ino, b"user.k", b"v", 0).unwrap();
    let after = cut_now(&dev);
    assert_eq!(after.getattr(g.ino).unwrap().perm, 0o600);
    assert_eq!(after.getxattr(g.ino, b"user.k").unwrap(), b"v");
    let mut block = AlignedBuf::zeroed(4096);
    block.fill(b'd');
    fs.write_direct(g.ino, 4096, &block).unwrap();
    assert_eq!(read(&cut_now(&dev), g.ino, 8192)[4096..], block[..]);
    fs.unmount().unwrap();

    // The mount options: `sync` makes everything synchronous, `dirsync`
    // the entries only.
    let (dev, fs) = crash_fs_with("sync");
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"at once").unwrap();
    assert_eq!(read(&cut_now(&dev), f, 7), b"at once");
    fs.unmount().unwrap();
    let (dev, fs) = crash_fs_with("dirsync");
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"later").unwrap();
    let after = cut_now(&dev);
    assert_eq!(after.lookup(root, b"f").unwrap().size, 0);
    fs.unmount().unwrap();
    fsck_clean(dev, "after the synchronous updates");
}

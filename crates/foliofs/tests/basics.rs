//! End-to-end behaviour of the library API on an in-memory device.

mod common;

use foliofs::device::{Device, MemDevice};
use foliofs::fs::*;
use foliofs::{Error, Fs};
use std::sync::Arc;

fn fresh(bytes: u64, bs: u32) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(bytes));
    let o = MkfsOptions {
        block_size: bs,
        ..Default::default()
    };
    mkfs(&*dev, &o, |_, _| {}).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    (dev, fs)
}

fn remount(dev: &Arc<MemDevice>, fs: Fs) -> Fs {
    fs.unmount().unwrap();
    Fs::mount(dev.clone(), MountOptions::default()).unwrap()
}

#[test]
fn write_read_remount() {
    for bs in [512u32, 4096, 65536] {
        let (dev, fs) = fresh(64 << 20, bs);
        let root = fs.root_ino();
        let f = fs.create(root, b"a", 0o644, 1, 2).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(fs.write(f.ino, 7, &data).unwrap(), data.len());
        let mut back = vec![0; data.len() + 7];
        assert_eq!(fs.read(f.ino, 0, &mut back).unwrap(), data.len() + 7);
        assert_eq!(&back[7..], &data[..]);
        assert_eq!(&back[..7], &[0; 7]);
        let fs = remount(&dev, fs);
        let ino = fs.lookup(root, b"a").unwrap().ino;
        assert_eq!(ino, f.ino);
        let mut back2 = vec![0; data.len() + 7];
        fs.read(ino, 0, &mut back2).unwrap();
        assert_eq!(back, back2, "block size {bs}");
        let a = fs.getattr(ino).unwrap();
        assert_eq!(
            (a.size, a.uid, a.gid, a.perm),
            (data.len() as u64 + 7, 1, 2, 0o644)
        );
        fs.unmount().unwrap();
    }
}

#[test]
fn namespace_round_trip() {
    let (dev, fs) = fresh(32 << 20, 4096);
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"dir", 0o755, 0, 0).unwrap();
    for i in 0..500 {
        fs.create(d.ino, format!("file-{i:04}").as_bytes(), 0o600, 0, 0)
            .unwrap();
    }
    assert!(matches!(
        fs.create(d.ino, b"file-0007", 0o600, 0, 0),
        Err(Error::Exists)
    ));
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(d.ino, cookie, 37).unwrap();
        if batch.is_empty() {
            break;
        }
        cookie = batch.last().unwrap().cookie;
        names.extend(
            batch
                .into_iter()
                .map(|e| String::from_utf8(e.name).unwrap()),
        );
    }
    assert_eq!(names.len(), 502);
    assert_eq!(&names[..2], &[".", ".."]);
    for i in (0..500).step_by(2) {
        fs.unlink(d.ino, format!("file-{i:04}").as_bytes()).unwrap();
    }
    fs.symlink(root, b"link", b"dir/file-0001", 0, 0).unwrap();
    let long = vec![b'x'; 1000];
    let l2 = fs.symlink(root, b"long", &long, 0, 0).unwrap();
    fs.rename(d.ino, b"file-0001", root, b"moved", 0).unwrap();
    let e = fs.mkdir(root, b"e", 0o700, 0, 0).unwrap();
    fs.rename(root, b"dir", e.ino, b"dir2", 0).unwrap();
    assert_eq!(fs.getattr(e.ino).unwrap().nlink, 3);
    assert!(matches!(
        fs.rename(root, b"e", e.ino, b"x", 0),
        Err(Error::Invalid(_))
    ));
    fs.setxattr(e.ino, b"user.k", b"v1", 0).unwrap();
    let fs = remount(&dev, fs);
    let d = fs.resolve("/e/dir2").unwrap();
    assert_eq!(fs.readdir(d, 0, 1000).unwrap().len(), 2 + 249);
    assert_eq!(
        fs.readlink(fs.resolve("/link").unwrap()).unwrap(),
        b"dir/file-0001"
    );
    assert_eq!(fs.readlink(l2.ino).unwrap(), long);
    assert_eq!(fs.getxattr(e.ino, b"user.k").unwrap(), b"v1");
    assert!(fs.resolve("/moved").is_ok());
    assert!(matches!(fs.rmdir(root, b"e"), Err(Error::NotEmpty)));
    fs.unmount().unwrap();
    let _ = dev.len();
}

#[test]
fn unlinked_open_file_lives_until_release() {
    let (dev, fs) = fresh(16 << 20, 4096);
    let root = fs.root_ino();
    let before = fs.statfs().unwrap();
    let f = fs.create(root, b"tmp", 0o644, 0, 0).unwrap();
    fs.open(f.ino).unwrap();
    fs.write(f.ino, 0, &vec![7u8; 1 << 20]).unwrap();
    fs.fsync(f.ino, false).unwrap();
    fs.unlink(root, b"tmp").unwrap();
    let mut b = [0u8; 4];
    fs.read(f.ino, 1000, &mut b).unwrap();
    assert_eq!(b, [7; 4]);
    fs.release(f.ino).unwrap();
    let fs = remount(&dev, fs);
    assert_eq!(fs.statfs().unwrap().blocks_free, before.blocks_free);
    fs.unmount().unwrap();
}

#[test]
fn rename_with_whiteout_leaves_a_whiteout_in_the_same_transaction() {
    let (dev, fs) = fresh(32 << 20, 4096);
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o2775, 0, 7).unwrap();
    let a = fs.create(d.ino, b"a", 0o644, 0, 0).unwrap();
    fs.write(a.ino, 0, b"contents").unwrap();
    fs.rename_whiteout((d.ino, b"a"), (root, b"b"), 0, (3, 3))
        .unwrap();
    // The whiteout: a character device 0:0, no permissions, the
    // caller's, the set-GID directory's group.
    let w = fs.lookup(d.ino, b"a").unwrap();
    assert_eq!(
        (w.kind, w.rdev, w.perm, w.uid, w.gid),
        (FileType::CharDev, 0, 0, 3, 7)
    );
    assert_eq!(fs.lookup(root, b"b").unwrap().ino, a.ino);
    // NOREPLACE still refuses a taken name; EXCHANGE does not combine.
    fs.create(d.ino, b"c", 0o644, 0, 0).unwrap();
    assert!(matches!(
        fs.rename_whiteout((d.ino, b"c"), (root, b"b"), RENAME_NOREPLACE, (0, 0)),
        Err(Error::Exists)
    ));
    assert!(fs
        .rename_whiteout((d.ino, b"c"), (root, b"b"), RENAME_EXCHANGE, (0, 0))
        .is_err());
    // Two names of one inode: nothing happens, as rename(2) does.
    fs.link(a.ino, root, b"b2").unwrap();
    fs.rename_whiteout((root, b"b"), (root, b"b2"), 0, (0, 0))
        .unwrap();
    assert_eq!(fs.lookup(root, b"b").unwrap().ino, a.ino);
    // Both halves are in one transaction: after a remount both are there.
    fs.sync().unwrap();
    let fs = remount(&dev, fs);
    assert_eq!(fs.lookup(d.ino, b"a").unwrap().kind, FileType::CharDev);
    assert_eq!(fs.lookup(root, b"b").unwrap().ino, a.ino);
}

#[test]
fn a_tmpfile_is_named_by_link_or_goes_with_its_last_close_or_a_crash() {
    let (dev, fs) = fresh(32 << 20, 4096);
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o2775, 0, 7).unwrap();
    let before = fs.statfs().unwrap();
    // Unnamed, open, mode from perm less umask, group from the set-GID
    // directory: nothing in the directory.
    let (a, h) = fs.tmpfile(d.ino, 0o666, 0o022, 5, 5).unwrap();
    assert_eq!((a.nlink, a.perm, a.uid, a.gid), (0, 0o644, 5, 7));
    let data = vec![9u8; 300_000];
    fs.write(a.ino, 0, &data).unwrap();
    fs.fsync_file(&h, false).unwrap();
    let listed = |fs: &Fs| -> Vec<Vec<u8>> {
        let all = fs.readdir(d.ino, 0, 100).unwrap().into_iter();
        all.map(|e| e.name)
            .filter(|n| !n.starts_with(b"."))
            .collect()
    };
    assert!(listed(&fs).is_empty());
    // link names it once; then it is an ordinary file.
    let named = fs.link(a.ino, d.ino, b"kept").unwrap();
    assert_eq!(named.nlink, 1);
    assert!(matches!(fs.link(a.ino, d.ino, b"kept"), Err(Error::Exists)));
    fs.release_file(h).unwrap();
    // One never named goes with its last close.
    let (b, hb) = fs.tmpfile(d.ino, 0o600, 0, 0, 0).unwrap();
    fs.write(b.ino, 0, &vec![1u8; 1 << 20]).unwrap();
    fs.fsync_file(&hb, false).unwrap();
    fs.release_file(hb).unwrap();
    assert!(matches!(
        fs.link(b.ino, d.ino, b"late"),
        Err(Error::NotFound)
    ));
    // One still open at a crash goes with the next mount.
    let (c, hc) = fs.tmpfile(d.ino, 0o600, 0, 0, 0).unwrap();
    fs.write(c.ino, 0, &vec![2u8; 1 << 20]).unwrap();
    fs.fsync_file(&hc, false).unwrap();
    let crashed = Arc::new(MemDevice::from_image(dev.image()));
    fs.release_file(hc).unwrap();
    fs.unmount().unwrap();
    let fs = Fs::mount(crashed.clone(), MountOptions::default()).unwrap();
    let kept = fs.lookup(d.ino, b"kept").unwrap();
    assert_eq!(
        (kept.ino, kept.nlink, kept.size),
        (a.ino, 1, data.len() as u64)
    );
    let mut back = vec![0u8; data.len()];
    fs.read(kept.ino, 0, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(listed(&fs), vec![b"kept".to_vec()]);
    // Only the named file's blocks stay in use.
    let after = fs.statfs().unwrap();
    assert_eq!(
        before.blocks_free - after.blocks_free,
        (data.len() as u64).div_ceil(4096),
        "{before:?} {after:?}"
    );
    fs.unmount().unwrap();
    common::fsck_clean(crashed, "the tmpfile after a crash");
}

#[test]
fn a_held_inode_outlives_its_last_name_until_unheld_or_unmount() {
    let (dev, fs) = fresh(16 << 20, 4096);
    let root = fs.root_ino();
    let before = fs.statfs().unwrap();
    let f = fs.create(root, b"held", 0o644, 0, 0).unwrap();
    fs.write(f.ino, 0, &vec![7u8; 1 << 20]).unwrap();
    fs.hold(f.ino).unwrap();
    fs.hold(f.ino).unwrap();
    fs.unlink(root, b"held").unwrap();
    // Still there by number: a time update, as a FUSE kernel flushes it.
    let t = Timespec {
        sec: 1_000,
        nsec: 5,
    };
    let set = SetAttr {
        mtime: Some(TimeSet::At(t)),
        ctime: Some(TimeSet::At(t)),
        ..Default::default()
    };
    let a = fs.setattr(f.ino, &set).unwrap();
    assert_eq!((a.nlink, a.mtime, a.ctime), (0, (1_000, 5), (1_000, 5)));
    // A hold is not an open: no close trims or frees it; one of two holds
    // going leaves it.
    fs.unhold(f.ino, 1).unwrap();
    assert!(fs.getattr(f.ino).is_ok());
    fs.unhold(f.ino, 1).unwrap();
    assert!(matches!(fs.getattr(f.ino), Err(Error::NotFound)));
    assert_eq!(fs.statfs().unwrap().blocks_free, before.blocks_free);
    // Held at unmount: it goes then.
    let g = fs.create(root, b"held2", 0o644, 0, 0).unwrap();
    fs.write(g.ino, 0, &[1u8; 9000]).unwrap();
    fs.hold(g.ino).unwrap();
    fs.unlink(root, b"held2").unwrap();
    let fs = remount(&dev, fs);
    assert!(matches!(fs.getattr(g.ino), Err(Error::NotFound)));
    assert_eq!(fs.statfs().unwrap().blocks_free, before.blocks_free);
    fs.unmount().unwrap();
}

#[test]
fn fsck_is_clean_after_work_and_finds_leaks() {
    let (dev, fs) = fresh(32 << 20, 4096);
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    for i in 0..100 {
        let f = fs
            .create(d.ino, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write(f.ino, (i * 1000) as u64, &vec![i as u8; 5000 + i * 300])
            .unwrap();
        fs.setxattr(f.ino, b"user.a", &[1; 100], 0).unwrap();
    }
    fs.unmount().unwrap();
    let opts = foliofs::fsck::FsckOptions {
        check_data: true,
        ..Default::default()
    };
    let r = foliofs::fsck::fsck(dev.clone(), &opts, |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    assert!(r.data_blocks_checked > 100);
    // Leak a block behind the engine's back: set a bitmap bit far into AG 0.
    let sb = foliofs::meta::read_superblock(&*dev).unwrap();
    let geo = foliofs::geometry::Geometry::new(&sb);
    let (bblk, bit) = geo.bmap_loc(geo.data_start_agbno(0) + 1500);
    let mut b = vec![0u8; 4096];
    dev.read_at(&mut b, bblk * 4096).unwrap();
    foliofs::format::bitmap::set_bit(&mut b, bit, true);
    foliofs::format::header::stamp(&mut b);
    dev.write_at(&b, bblk * 4096).unwrap();
    let r = foliofs::fsck::fsck(dev.clone(), &Default::default(), |_, _| {}).unwrap();
    assert_eq!(r.exit_code(), 4);
    assert!(
        r.problems.iter().any(|p| p.message.contains("leaked")),
        "{:?}",
        r.problems
    );
    let r = foliofs::fsck::fsck(
        dev.clone(),
        &foliofs::fsck::FsckOptions {
            repair: true,
            check_data: false,
        },
        |_, _| {},
    )
    .unwrap();
    assert_eq!(r.exit_code(), 1);
    let r = foliofs::fsck::fsck(dev.clone(), &Default::default(), |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn mkfs_gives_the_root_directory_its_owner() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let o = MkfsOptions {
        root_owner: (1000, 100),
        ..Default::default()
    };
    mkfs(&*dev, &o, |_, _| {}).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let a = fs.getattr(fs.root_ino()).unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (1000, 100, 0o755));
    fs.unmount().unwrap();
    let (_, fs) = fresh(64 << 20, 4096);
    let a = fs.getattr(fs.root_ino()).unwrap();
    assert_eq!((a.uid, a.gid), (0, 0), "the library's default");
}

/// The error is EPERM (chattr's flags, or the privilege to set them).
fn eperm<T: std::fmt::Debug>(r: Result<T, Error>, what: &str) {
    match r {
        Err(e) => assert_eq!(e.errno(), libc::EPERM, "{what}: {e}"),
        Ok(v) => panic!("{what}: allowed ({v:?})"),
    }
}

#[test]
fn chattr_immutable_and_append_only_are_enforced_and_kept() {
    let (dev, fs) = fresh(64 << 20, 4096);
    let root = fs.root_ino();
    let f = fs.create(root, b"f", 0o644, 1000, 1000).unwrap().ino;
    fs.write(f, 0, &[7u8; 8192]).unwrap();
    fs.setxattr(f, b"user.k", b"v", 0).unwrap();
    fs.create(root, b"victim", 0o644, 0, 0).unwrap();

    // Who may set what.
    assert!(matches!(
        fs.set_flags(f, FL_IMMUTABLE | 0x1000, true),
        Err(Error::Unsupported(_))
    ));
    eperm(fs.set_flags(f, FL_IMMUTABLE, false), "+i unprivileged");
    eperm(fs.set_flags(f, FL_APPEND, false), "+a unprivileged");
    let a = fs.set_flags(f, FL_NODUMP, false).unwrap();
    assert_eq!(a.flags, FL_NODUMP);
    let a = fs.set_flags(f, FL_IMMUTABLE | FL_NODUMP, true).unwrap();
    assert_eq!(a.flags, FL_IMMUTABLE | FL_NODUMP);

    // Immutable: reads only.
    let mut buf = vec![0u8; 8192];
    assert_eq!(fs.read(f, 0, &mut buf).unwrap(), 8192);
    eperm(fs.write(f, 8192, b"x"), "write");
    eperm(fs.write(f, 0, b"x"), "overwrite");
    let block = foliofs::device::AlignedBuf::zeroed(4096);
    eperm(fs.write_direct(f, 0, &block), "direct write");
    let size = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    eperm(fs.setattr(f, &size), "truncate");
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    eperm(fs.setattr(f, &chmod), "chmod");
    let touch = SetAttr {
        mtime: Some(TimeSet::Now),
        ..Default::default()
    };
    eperm(fs.setattr(f, &touch), "utimes");
    eperm(
        fs.fallocate(f, Falloc::Allocate { keep_size: true }, 0, 1 << 20),
        "fallocate",
    );
    eperm(fs.setxattr(f, b"user.k", b"w", 0), "setxattr");
    eperm(fs.removexattr(f, b"user.k"), "removexattr");
    eperm(fs.unlink(root, b"f"), "unlink");
    eperm(fs.rename(root, b"f", root, b"g", 0), "rename");
    eperm(fs.rename(root, b"victim", root, b"f", 0), "rename over");
    eperm(fs.link(f, root, b"f2"), "link");
    assert_eq!(fs.getxattr(f, b"user.k").unwrap(), b"v");

    // Kept across a remount; clearing it gives everything back.
    let fs = remount(&dev, fs);
    assert_eq!(fs.getattr(f).unwrap().flags, FL_IMMUTABLE | FL_NODUMP);
    eperm(fs.write(f, 0, b"x"), "write after remount");
    fs.set_flags(f, FL_APPEND, true).unwrap();

    // Append-only: appends, times and allocation; nothing else.
    fs.write(f, 8192, b"tail").unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 8196);
    fs.setattr(f, &touch).unwrap();
    let past = TimeSet::At(Timespec { sec: 1000, nsec: 0 });
    let picked = SetAttr {
        atime: Some(past),
        mtime: Some(past),
        ..Default::default()
    };
    eperm(fs.setattr(f, &picked), "utimes with times, append-only");
    // A cache in front handing over the times it owns (after appends).
    let handed = SetAttr {
        mtime: Some(past),
        ctime: Some(past),
        ..Default::default()
    };
    fs.setattr(f, &handed).unwrap();
    fs.fallocate(f, Falloc::Allocate { keep_size: true }, 0, 1 << 20)
        .unwrap();
    eperm(fs.fallocate(f, Falloc::PunchHole, 0, 4096), "punch");
    eperm(fs.setattr(f, &size), "truncate append-only");
    eperm(fs.setattr(f, &chmod), "chmod append-only");
    eperm(fs.unlink(root, b"f"), "unlink append-only");
    eperm(fs.setxattr(f, b"user.k", b"w", 0), "setxattr append-only");
    fs.set_flags(f, 0, true).unwrap();
    fs.setattr(f, &size).unwrap();
    fs.unlink(root, b"f").unwrap();

    // Directories: +i freezes the entries, +a lets names in, not out.
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let inner = fs.create(d, b"in", 0o644, 0, 0).unwrap().ino;
    fs.set_flags(d, FL_IMMUTABLE, true).unwrap();
    eperm(fs.create(d, b"new", 0o644, 0, 0), "create in +i");
    eperm(fs.mkdir(d, b"sub", 0o755, 0, 0), "mkdir in +i");
    eperm(fs.unlink(d, b"in"), "unlink in +i");
    eperm(fs.rename(root, b"victim", d, b"v", 0), "rename into +i");
    eperm(fs.tmpfile(d, 0o644, 0, 0, 0), "tmpfile in +i");
    fs.write(inner, 0, b"the file itself is not frozen")
        .unwrap();
    fs.set_flags(d, FL_APPEND, true).unwrap();
    fs.create(d, b"new", 0o644, 0, 0).unwrap();
    fs.rename(root, b"victim", d, b"v", 0).unwrap();
    eperm(fs.unlink(d, b"in"), "unlink in +a");
    eperm(fs.rename(d, b"v", root, b"victim", 0), "rename out of +a");
    eperm(fs.rename(d, b"v", d, b"new", 0), "rename over in +a");
    fs.set_flags(d, 0, true).unwrap();
    fs.unlink(d, b"in").unwrap();
    fs.unmount().unwrap();
    common::fsck_clean(dev, "after chattr");
}

#[test]
fn chattr_noatime_keeps_reads_from_stamping_atime() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    let o = MountOptions {
        atime: Atime::Strictatime,
        ..Default::default()
    };
    let fs = Fs::mount(dev.clone(), o).unwrap();
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"data").unwrap();
    let past = SetAttr {
        atime: Some(TimeSet::At(Timespec { sec: 1000, nsec: 0 })),
        ..Default::default()
    };
    fs.setattr(f, &past).unwrap();
    let mut buf = [0u8; 4];
    fs.set_flags(f, FL_NOATIME, false).unwrap();
    assert!(!fs.atime_due(f).unwrap());
    fs.read(f, 0, &mut buf).unwrap();
    assert_eq!(fs.getattr(f).unwrap().atime, (1000, 0));
    fs.set_flags(f, 0, false).unwrap();
    assert!(fs.atime_due(f).unwrap());
    fs.read(f, 0, &mut buf).unwrap();
    assert!(fs.getattr(f).unwrap().atime.0 > 1000);
    fs.unmount().unwrap();
}

#[test]
fn shutdown_on_request_is_a_crash_with_or_without_the_log_flushed() {
    for flush_log in [true, false] {
        let (dev, fs) = fresh(64 << 20, 4096);
        let root = fs.root_ino();
        let kept = fs.create(root, b"kept", 0o644, 0, 0).unwrap().ino;
        fs.write(kept, 0, b"fsynced").unwrap();
        fs.fsync(kept, false).unwrap();
        let late = fs.create(root, b"late", 0o644, 0, 0).unwrap().ino;
        fs.write(late, 0, b"cached only").unwrap();
        fs.shutdown(flush_log).unwrap();
        fs.shutdown(flush_log).unwrap();
        assert!(matches!(fs.write(kept, 0, b"x"), Err(Error::Shutdown(_))));
        assert!(matches!(
            fs.create(root, b"new", 0o644, 0, 0),
            Err(Error::Shutdown(_))
        ));
        assert!(fs.unmount().is_err(), "unmount reports the shutdown");
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let mut buf = [0u8; 16];
        let n = fs.read(kept, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"fsynced");
        // The flushed log has the create; the data was never written.
        match fs.lookup(root, b"late") {
            Ok(a) => {
                assert!(flush_log, "the create survived an unflushed log");
                assert_eq!(a.size, 0);
            }
            Err(e) => {
                assert!(!flush_log, "the flushed log lost the create: {e}");
                assert!(matches!(e, Error::NotFound));
            }
        }
        fs.unmount().unwrap();
        common::fsck_clean(dev, "after the shutdown");
    }
}

#[test]
fn a_read_only_mount_replays_the_journal_into_memory() {
    let (dev, fs) = fresh(64 << 20, 4096);
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"fsynced before the crash").unwrap();
    fs.fsync(f, false).unwrap();
    let crashed = Arc::new(MemDevice::from_image(dev.image()));
    fs.unmount().unwrap();
    let before = crashed.image();
    let report = common::fsck_clean(
        Arc::new(MemDevice::from_image(before.clone())),
        "the crashed image",
    );
    assert!(report.journal_replayed > 0, "nothing to replay");
    let ro = MountOptions {
        read_only: true,
        ..Default::default()
    };
    for _ in 0..2 {
        let fs = Fs::mount(crashed.clone(), ro.clone()).unwrap();
        let a = fs.lookup(fs.root_ino(), b"f").unwrap();
        let mut buf = vec![0u8; 64];
        let n = fs.read(a.ino, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"fsynced before the crash");
        assert!(matches!(
            fs.create(fs.root_ino(), b"g", 0o644, 0, 0),
            Err(Error::ReadOnly)
        ));
        fs.unmount().unwrap();
        assert!(crashed.image() == before, "a read-only mount wrote");
    }
    let fs = Fs::mount(crashed.clone(), MountOptions::default()).unwrap();
    assert_eq!(fs.lookup(fs.root_ino(), b"f").unwrap().size, 24);
    fs.unmount().unwrap();
    common::fsck_clean(crashed, "after the read-write replay");
}

//! `durability=local` when the cache directory's disk fills up (a
//! machine's root file system taken by something else, a `cache_size`
//! larger than the disk): the chunk copies make room for the local WAL,
//! and a flush the local WAL still cannot take goes to the store itself,
//! so that a writer's fsyncs go on returning and what they covered
//! survives the machine. The disk is a real one, a small tmpfs; mounting
//! it needs root (the tests say so and skip without it, unless
//! FOLIOFS_REQUIRE_FUSE=1, as in CI).

mod common;

use common::{mkfs_with as mkfs, verify_files, write_files};
use foliofs::{Fs, MountOptions};
use foliofs_object::{Durability, InMemory, ObjectDevice, ObjectOptions, ObjectStore, Path};
use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

/// A tmpfs of a given size, unmounted when dropped.
struct SmallDisk {
    dir: std::path::PathBuf,
}

impl SmallDisk {
    /// A tmpfs of `bytes` at a new directory; None where this process may
    /// not mount one (not root), having said so.
    fn new(name: &str, bytes: u64) -> Option<SmallDisk> {
        let dir = std::env::temp_dir().join(format!("foliofs-full-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let data = CString::new(format!("size={bytes}")).unwrap();
        // SAFETY: every pointer is a NUL-terminated string that outlives
        // the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            let _ = std::fs::remove_dir(&dir);
            if std::env::var("FOLIOFS_REQUIRE_FUSE").as_deref() == Ok("1") {
                panic!("FOLIOFS_REQUIRE_FUSE=1, but a tmpfs cannot be mounted here: {e}");
            }
            eprintln!("SKIPPED: a full disk for the cache_dir needs a tmpfs mount (root): {e}");
            return None;
        }
        Some(SmallDisk { dir })
    }

    /// Take every byte left with a file of its own; returns its path.
    fn fill(&self) -> std::path::PathBuf {
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        for step in [1 << 20, 4096] {
            let zeros = vec![0u8; step];
            while f.write_all(&zeros).is_ok() {}
        }
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let target = CString::new(self.dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn local(dir: &std::path::Path) -> ObjectOptions {
    ObjectOptions {
        cache_dir: Some(dir.to_path_buf()),
        durability: Durability::Local,
        ..Default::default()
    }
}

fn content(i: usize) -> Vec<u8> {
    (0..20_000 + i * 4099)
        .map(|k| (k * 11 + i * 7) as u8)
        .collect()
}

/// Every file `f i` for i in `files` reads back whole from the image as
/// another machine finds it (the store alone, an empty cache, takeover),
/// and fsck finds the image clean.
fn verify_elsewhere(store: Arc<dyn ObjectStore>, files: std::ops::Range<usize>) {
    let opts = ObjectOptions {
        takeover: true,
        ..Default::default()
    };
    let dev = Arc::new(ObjectDevice::open(store, Path::from("img"), opts).unwrap());
    verify_files(dev.clone(), files, content);
    dev.close().unwrap();
}

/// The writer stopped (killed, its machine up again): open the image
/// from the same cache directory, which ships what its local WAL holds,
/// and close it.
fn restart_from(store: &Arc<dyn ObjectStore>, cache: &std::path::Path) {
    let again = ObjectOptions {
        takeover: true,
        ..local(cache)
    };
    let dev = ObjectDevice::open(store.clone(), Path::from("img"), again).unwrap();
    dev.close().unwrap();
}

/// The local disk filled by something else while a writer fsyncs: each
/// fsync still returns, through the store, and the local WAL holds
/// nothing that could ship again over it; the machine then lost, another
/// finds every file. Once the disk has room and the pause is over,
/// flushes go to the local WAL again.
#[test]
fn fsyncs_the_full_local_disk_cannot_take_go_to_the_store() {
    let Some(disk) = SmallDisk::new("past", 24 << 20) else {
        return;
    };
    let cache = disk.dir.join("cache");
    let inner = Arc::new(InMemory::new());
    let store: Arc<dyn ObjectStore> = inner.clone();
    let dev = mkfs(store.clone(), local(&cache));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_files(&fs, 0..3, content);
    assert_eq!(dev.stats().flushes_past_local_wal, 0);
    let filler = disk.fill();
    // More than the segment open has left: the next needs a new one.
    for i in 3..10 {
        let f = fs
            .create(fs.root_ino(), format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write(f.ino, 0, &content(i)).unwrap();
        fs.write(f.ino, 1 << 20, &vec![i as u8; 4 << 20]).unwrap();
        fs.fsync(f.ino, false)
            .unwrap_or_else(|e| panic!("fsync of f{i} on a full local disk: {e}"));
    }
    let st = dev.stats();
    assert!(st.flushes_past_local_wal > 0, "{st:?}");
    assert!(st.fenced.is_none(), "{st:?}");
    assert_eq!(st.unshipped_bytes, 0, "{st:?}");
    let left: Vec<_> = std::fs::read_dir(cache.join("wal")).unwrap().collect();
    assert!(
        left.is_empty(),
        "the local WAL was emptied before a flush past it, and no half-made segment is left: \
         {left:?}"
    );
    // Room again, and the pause over: the local WAL takes flushes.
    std::fs::remove_file(filler).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5200));
    let before = dev.stats().flushes_past_local_wal;
    write_files(&fs, 10..12, content);
    let st = dev.stats();
    assert_eq!(st.flushes_past_local_wal, before, "{st:?}");
    // Killed there: the next open from the same cache directory ships
    // what its local WAL holds, the last two files, and nothing older
    // over the flushes that went past it.
    drop(fs);
    drop(dev);
    restart_from(&store, &cache);
    verify_elsewhere(store, 0..12);
}

/// A cache directory whose chunk copies filled its disk: the local WAL
/// takes the next flush after the least recently used copies make room,
/// rather than the flush going past it.
#[test]
fn chunk_copies_make_room_for_the_local_wal() {
    let Some(disk) = SmallDisk::new("room", 48 << 20) else {
        return;
    };
    let cache = disk.dir.join("cache");
    let inner = Arc::new(InMemory::new());
    let store: Arc<dyn ObjectStore> = inner.clone();
    // Written with durability=object: the whole chunks flushed are kept
    // in the cache directory at close.
    let object = ObjectOptions {
        cache_dir: Some(cache.clone()),
        ..Default::default()
    };
    let dev = mkfs(store.clone(), object);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let f = fs.create(fs.root_ino(), b"big", 0o644, 0, 0).unwrap();
    fs.write(f.ino, 0, &vec![7u8; 24 << 20]).unwrap();
    fs.fsync(f.ino, false).unwrap();
    fs.unmount().unwrap();
    dev.close().unwrap();
    drop(dev);
    let dev =
        Arc::new(ObjectDevice::open(store.clone(), Path::from("img"), local(&cache)).unwrap());
    let copies = dev.stats().cache_dir.expect("a cache_dir").chunks;
    assert!(copies >= 6, "24 MiB written whole: {copies} chunk copies");
    let _filler = disk.fill();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_files(&fs, 0..2, content);
    let st = dev.stats();
    assert_eq!(st.flushes_past_local_wal, 0, "{st:?}");
    assert!(st.unshipped_bytes > 0 || st.wal_puts > 0, "{st:?}");
    let now = st.cache_dir.expect("a cache_dir").chunks;
    assert!(now < copies, "no chunk copy made room: {now} of {copies}");
    // Killed there: the local WAL ships at the next open from it.
    drop(fs);
    drop(dev);
    restart_from(&store, &cache);
    verify_elsewhere(store, 0..2);
}

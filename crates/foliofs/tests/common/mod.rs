//! Helpers the integration tests share.
#![allow(dead_code)]

use foliofs::device::{CrashDevice, Device, MemDevice};
use foliofs::fs::{mkfs, MkfsOptions, MountOptions};
use foliofs::fsck::{fsck, FsckOptions, Report};
use foliofs::Fs;
use std::sync::Arc;

/// A number from the environment (seeds, run lengths), or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// fsck of the unmounted `dev`, data checksums included: it must be clean.
pub fn fsck_clean(dev: Arc<dyn Device>, ctx: &str) -> Report {
    let opts = FsckOptions {
        repair: false,
        check_data: true,
    };
    let r = fsck(dev, &opts, |_, _| {}).unwrap_or_else(|e| panic!("{ctx}: fsck: {e}"));
    assert!(r.is_clean(), "{ctx}: fsck: {:?}", r.problems);
    r
}

/// A fresh default file system of `bytes` on a crash-recording device,
/// mounted with default options.
pub fn crash_fs(bytes: u64) -> (Arc<CrashDevice>, Fs) {
    let mem = MemDevice::new(bytes);
    mkfs(&mem, &MkfsOptions::default(), |_, _| {}).unwrap();
    let dev = Arc::new(CrashDevice::new(mem.image()));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    (dev, fs)
}

/// The content of small file `i` of the many-small-files tests: 100 to
/// ~9,100 bytes, different for every file.
pub fn small_file(i: u64) -> Vec<u8> {
    let len = 100 + (i * 997) % 9000;
    (0..len).map(|k| (k * 31 + i * 7) as u8 | 1).collect()
}

/// Create `f{i}` in `dir` for i in `range`, written with `small_file(i)`
/// through an open file description and closed, as tar does; `after(i)`
/// runs after each. Returns the inodes.
pub fn write_small_files(
    fs: &Fs,
    dir: u64,
    range: std::ops::Range<u64>,
    mut after: impl FnMut(u64),
) -> Vec<u64> {
    range
        .map(|i| {
            let a = fs
                .create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            let (_, of) = fs.open_file(a.ino).unwrap();
            fs.write(a.ino, 0, &small_file(i)).unwrap();
            fs.release_file(of).unwrap();
            after(i);
            a.ino
        })
        .collect()
}

/// Every `f{i}` in `dir` holds `small_file(i)`, no more, no less.
pub fn check_small_files(fs: &Fs, dir: u64, range: std::ops::Range<u64>) {
    for i in range {
        let ino = fs.lookup(dir, format!("f{i}").as_bytes()).unwrap().ino;
        let want = small_file(i);
        let mut got = vec![0u8; want.len() + 1];
        let n = fs.read(ino, 0, &mut got).unwrap();
        assert_eq!(&got[..n], &want[..], "f{i}");
    }
}

/// What a test device does around each read and each write of the
/// memory device under it (`Hooked`), given its length and the I/O to
/// run: by default, just that.
pub trait Hooks: Send + Sync {
    fn read(
        &self,
        _len: usize,
        io: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        io()
    }
    fn write(
        &self,
        _len: usize,
        io: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        io()
    }
}

/// A memory device whose reads and writes go through `hooks` (which
/// it derefs to, for the test to reach their state).
pub struct Hooked<H> {
    pub mem: Arc<MemDevice>,
    pub hooks: H,
}

impl<H> std::ops::Deref for Hooked<H> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.hooks
    }
}

impl<H: Hooks> Device for Hooked<H> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.hooks
            .read(buf.len(), &mut || self.mem.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.hooks
            .write(buf.len(), &mut || self.mem.write_at(buf, offset))
    }
    fn flush(&self) -> std::io::Result<()> {
        self.mem.flush()
    }
    fn len(&self) -> u64 {
        self.mem.len()
    }
}

//! FUSE adapter: serves a mounted foliofs engine (`foliofs::Fs`) to the
//! kernel through fuser. The engine knows nothing of FUSE; every request
//! here is a translation, and errno mapping happens in one place
//! (`errno`).
//!
//! Caching (`CacheOptions`): this mount is the only writer of its image
//! (the image lock refuses every other opener), so the kernel may trust
//! what it caches: attributes, names and missing names for a long time,
//! file data across opens (FOPEN_KEEP_CACHE), except when a read would
//! update the access time (relatime after a change, strictatime always):
//! then the open drops the cached pages, so the read reaches the engine,
//! which stamps the atime. With `writeback_cache` (the
//! default) the kernel also caches writes and owns size and times while
//! it does; its writeback reaches the engine as large writes. O_DIRECT opens get
//! FOPEN_DIRECT_IO and reach the engine's direct path as the caller made
//! them (checksummed, overwrites in parallel under a shared inode lock).
//! So do opens for writing while the free space does not cover what the
//! kernel may cache (`space`), through the engine's page cache, so that
//! ENOSPC reaches write(2); descriptions opened before are gated there.
//! Where a file is open both ways, the adapter keeps the two coherent as
//! the kernel does for its own file systems: before a direct request it
//! has the kernel write back and drop its pages of the file (while a
//! cached description is open for writing), after a direct write it has
//! the kernel drop its now stale pages of the range (FUSE_NOTIFY_INVAL_INODE).
//!
//! The counters are readable as the xattr `foliofs.counters` (JSON) of the
//! mount's root directory (`foliofs stat --mount DIR` prints them).
//!
//! This file translates requests and nothing else. The rest by job:
//! `session` mounts and serves (every request thread is made there),
//! `uring` speaks the ring protocol, `threads` counts the request threads
//! and keeps one free for the kernel's writeback, `coherence` keeps the
//! kernel's page cache coherent with the engine (`KernelCache`), `space`
//! keeps ENOSPC in write(2) under the kernel's write cache.

use foliofs::device::AlignedBuf;
use foliofs::fs::{
    listing, Attr, Falloc, FileType, NewNode, OpenFile, SetAttr, TimeSet, Whence, FL_APPEND,
    FL_DIRSYNC, FL_IMMUTABLE, FL_NOATIME, FL_NODUMP, FL_SYNC,
};
use foliofs::{Error, Fs};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod bdi;
mod coherence;
pub mod session;
pub mod space;
pub mod threads;
pub mod uring;

use coherence::{Handle, KernelCache};
pub use space::CacheFloor;
use space::SpaceGate;
use threads::Transport;

/// The virtual xattr on the root that returns the counters as JSON.
pub const COUNTERS_XATTR: &str = "foliofs.counters";

/// The virtual xattr on the root that makes the device fail from now on,
/// on a mount made with `-o fault_injection` (tests; root only): a
/// comma-separated list of `reads`, `writes`, `flushes`, or `none`.
pub const FAULT_XATTR: &str = "foliofs.fault";

/// `ioctl(fd, FOLIOFS_IOC_SYNC)` on any file or directory of the mount
/// (`_IO(0xb7, 1)`, no argument): the daemon writes back and commits
/// everything, as a disk file system does at syncfs. Linux sends
/// FUSE_SYNCFS to virtiofs only, so sync(1) and syncfs(2) on a FUSE
/// mount push the kernel's cached writes to the daemon and stop there;
/// `foliofs sync PATH` does syncfs and then this (as `btrfs filesystem
/// sync` uses BTRFS_IOC_SYNC).
pub const FOLIOFS_IOC_SYNC: u32 = (0xb7 << 8) | 1;

/// The `sync` and `dirsync` mount options of a live mount, as a u32 (bit
/// 0 sync, bit 1 dirsync): `_IOW(0xb7, 2, u32)` sets them (root only),
/// `_IOR(0xb7, 3, u32)` reads them. `mount -o remount,sync` uses them
/// (`set_sync_mode`): the kernel's own flag changes by the remount, the
/// engine's by the ioctl.
pub const FOLIOFS_IOC_SET_SYNC_MODE: u32 = 0x4004_b702;
pub const FOLIOFS_IOC_GET_SYNC_MODE: u32 = 0x8004_b703;

/// chattr's ioctls as the kernel forwards them (FUSE_IOCTL from its
/// fileattr calls): the flags as an int, or a struct fsxattr.
const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
const FSXATTR_SIZE: usize = 28;
/// Shut the file system down (XFS_IOC_GOINGDOWN, ext4's and f2fs's
/// shutdown; root only).
const FS_IOC_SHUTDOWN: u32 = 0x8004_587d;
/// FS_XFLAG_* and the FS_*_FL flag each stands for (dirsync has none).
const XFLAGS: [(u32, u32); 5] = [
    (0x08, FL_IMMUTABLE),
    (0x10, FL_APPEND),
    (0x20, FL_SYNC),
    (0x40, FL_NOATIME),
    (0x80, FL_NODUMP),
];

fn xflags_of(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(_, f)| flags & f != 0)
        .fold(0, |acc, (x, _)| acc | x)
}

/// The FS_*_FL flags for FS_XFLAG_* `x`; None if it has others.
fn flags_of_xflags(x: u32) -> Option<u32> {
    let known = XFLAGS.iter().fold(0, |acc, (x, _)| acc | x);
    (x & !known == 0).then(|| {
        XFLAGS
            .iter()
            .filter(|(xf, _)| x & xf != 0)
            .fold(0, |acc, (_, f)| acc | f)
    })
}

/// Whether a file with chattr `flags` may be opened with open(2)
/// `oflags`, as Linux's may_open has it: not for writing or truncation
/// when immutable; when append-only, writing only with O_APPEND and no
/// truncation. (The kernel does not know a FUSE file's flags.)
fn open_allowed(flags: u32, oflags: i32) -> bool {
    let write = oflags & libc::O_ACCMODE != libc::O_RDONLY;
    let trunc = oflags & libc::O_TRUNC != 0;
    if flags & FL_IMMUTABLE != 0 {
        return !write && !trunc;
    }
    if flags & FL_APPEND != 0 {
        return !trunc && (!write || oflags & libc::O_APPEND != 0);
    }
    true
}

/// Set a live mount's `sync` and `dirsync` options (None: leave it as it
/// is) through an open file or directory of it.
pub fn set_sync_mode(
    f: &std::fs::File,
    sync: Option<bool>,
    dirsync: Option<bool>,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut mode: u32 = 0;
    // SAFETY: a valid descriptor; the command writes a u32 through the
    // pointer.
    if unsafe { libc::ioctl(f.as_raw_fd(), FOLIOFS_IOC_GET_SYNC_MODE as _, &mut mode) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    for (bit, want) in [(1, sync), (2, dirsync)] {
        match want {
            Some(true) => mode |= bit,
            Some(false) => mode &= !bit,
            None => {}
        }
    }
    // SAFETY: a valid descriptor; the command reads a u32 through the
    // pointer.
    if unsafe { libc::ioctl(f.as_raw_fd(), FOLIOFS_IOC_SET_SYNC_MODE as _, &mode) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What `foliofs sync` does on an open file or directory: syncfs of its
/// file system, then FOLIOFS_IOC_SYNC. Ok(false) when the file system is
/// not a foliofs mount (the ioctl is not one of its commands): syncfs
/// alone did what could be done.
pub fn sync_mount(f: &std::fs::File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a valid descriptor; the command takes no argument.
    if unsafe { libc::ioctl(f.as_raw_fd(), FOLIOFS_IOC_SYNC as _) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOTTY | libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP) => Ok(false),
        _ => Err(e),
    }
}

/// Whether the caller of `req` is in group `gid`: its group, or one of
/// its supplementary groups (from /proc, which is where they are).
fn caller_in_group(req: &Request, gid: u32) -> bool {
    if req.gid() == gid {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid())) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
}

/// How the kernel may cache what this mount serves.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    /// FUSE_WRITEBACK_CACHE: the kernel caches writes and sends them as
    /// page-cache writeback (or at fsync, close); the adapter keeps
    /// O_DIRECT opens coherent with it (`kernel_writeback`).
    pub writeback_cache: bool,
    /// How long the kernel trusts attributes. Only this mount changes the
    /// file system, so the kernel's own updates keep them right.
    pub attr_timeout: Duration,
    /// How long the kernel trusts a name's lookup.
    pub entry_timeout: Duration,
    /// How long the kernel trusts that a name does not exist.
    pub negative_timeout: Duration,
    /// Background requests (readahead, writeback) the kernel keeps in
    /// flight at once.
    pub max_background: u16,
    /// Offer readdirplus (listings with attributes, when the kernel
    /// sees lookups follow a listing). Off by default: measured here it
    /// makes a cold `ls -lR` 1.4x faster but a warm one 0.64x and a plain
    /// listing 0.75x.
    pub readdirplus: bool,
    /// With the writeback cache, the space kept free for the kernel's
    /// cached writes while files are open for writing through it
    /// (`space`): a file opened for writing when the free space does not
    /// cover it is served uncached (FOPEN_DIRECT_IO, through the engine's
    /// own cache), so that a write the file system has no room for fails
    /// in write(2) with ENOSPC, as on a kernel file system, and writes
    /// through descriptions opened before fail there too once a
    /// writeback has taken part of it. `Auto`: from the kernel's dirty
    /// limit for the mount.
    pub cache_floor: CacheFloor,
    /// How far the kernel reads ahead of a sequential reader (0: as the
    /// kernel sets it). The kernel offers a FUSE mount 128 KiB at INIT:
    /// 128 KiB requests, a few at a time, while the engine reads a
    /// stream in folios of up to 1 MiB. Set on the mount's backing device
    /// after INIT, by root.
    pub read_ahead: u64,
    /// Files opened for writing (without O_DIRECT) bypass the kernel's
    /// page cache (FOPEN_DIRECT_IO), as the low-space opens do: each
    /// write goes to the engine's cache as it is made, with no page of
    /// the kernel's in its path. Large sequential writers gain (W4 0.81–
    /// 0.86 of XFS against 0.66–0.77 cached, measured 2026-11-29); small
    /// writes each make a round trip to the daemon instead of merging in
    /// the kernel's pages. Off by default.
    pub direct_writes: bool,
}

impl Default for CacheOptions {
    fn default() -> Self {
        let day = Duration::from_secs(86_400);
        CacheOptions {
            writeback_cache: true,
            attr_timeout: day,
            entry_timeout: day,
            negative_timeout: day,
            max_background: 64,
            readdirplus: false,
            cache_floor: CacheFloor::Auto,
            read_ahead: DEFAULT_READ_AHEAD,
            direct_writes: false,
        }
    }
}

/// `CacheOptions::read_ahead` unless set: eight 1 MiB requests in
/// flight for a sequential reader, four of the engine's largest folios.
/// Measured (a cold 2 GiB read, alternated): 2 MiB gave 0.69–0.76 of XFS
/// on a loop device, 8 MiB 0.73–0.82.
pub const DEFAULT_READ_AHEAD: u64 = 8 << 20;

/// The unit of O_DIRECT requests: the logical sector of the disks Linux's
/// own file systems sit on, which refuse (EINVAL) a direct request whose
/// offset or length is not a multiple of it (`FuseFs::direct_path`).
const DIRECT_IO_SECTOR: u64 = 512;

/// Largest request the kernel sends (1 MiB: 256 pages, the default
/// `fs.fuse.max_pages_limit`).
pub const MAX_WRITE: u32 = 1 << 20;

/// The pages one request may span: `MAX_WRITE` and one more. A program's
/// buffer is seldom page-aligned (glibc's malloc puts a large one 16
/// bytes into its mapping), so a 1 MiB write() from it spans 257 pages;
/// at 256 the kernel sent it as 1 MiB less 16 bytes and then 16 bytes,
/// two requests each ending in a partial block. The kernel caps this at
/// `fs.fuse.max_pages_limit` (256 unless root raises it, as
/// `scripts/fuse-uring.sh`, run by setup, does). The rings' payloads
/// (`MAX_WRITE` and 64 KiB) hold a request of that many pages.
pub fn max_pages() -> u16 {
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u32;
    (MAX_WRITE / page + 1) as u16
}

/// The kernel's cap on `max_pages` for new FUSE mounts.
pub const MAX_PAGES_LIMIT: &str = "/proc/sys/fs/fuse/max_pages_limit";

pub struct FuseFs {
    fs: Arc<Fs>,
    /// The space kept for the kernel's cached writes, and the gate that
    /// refuses them when it runs short.
    space: SpaceGate,
    /// What the kernel caches of the files, kept coherent with the engine.
    kernel: KernelCache,
    cache: CacheOptions,
    posix_acl: bool,
    /// Ask for FUSE over io_uring at INIT; `transport` says whether the
    /// kernel agreed, and counts what the rings serve.
    io_uring: bool,
    transport: Arc<Transport>,
    /// When the kernel's INIT arrived (the counters' `mounted_secs`).
    mounted_at: Option<Instant>,
    /// The kernel agreed to send no opendir/releasedir (see `opendir`).
    no_opendir: bool,
    /// The kernel leaves taking suid/sgid and capabilities to us
    /// (FUSE_HANDLE_KILLPRIV_V2; see `setattr`, `write`).
    killpriv: bool,
    /// Opens served uncached because space was low (`new_handle`).
    uncached_opens: AtomicU64,
    /// WRITE requests other than the kernel's writeback: each a
    /// program's write() as it made it (uncached descriptions, or a mount
    /// without the writeback cache), one per write() up to `MAX_WRITE`
    /// when the kernel allows `max_pages()`.
    uncached_writes: AtomicU64,
    /// `CacheOptions::read_ahead` is set on the backing device at the
    /// first open (after INIT, whose reply would undo it).
    read_ahead_set: std::sync::Once,
    /// The device's fault switches (`-o fault_injection`, `FAULT_XATTR`).
    faults: Option<Arc<foliofs::device::Faults>>,
    device_status: Option<DeviceStatus>,
}

/// What the mount asks of the adapter.
#[derive(Clone, Default)]
pub struct FuseOptions {
    /// How the kernel may cache what the mount serves.
    pub cache: CacheOptions,
    /// Let the kernel enforce POSIX ACLs (FUSE_POSIX_ACL) and leave the
    /// umask to the engine (FUSE_DONT_MASK), which applies it only where
    /// the parent has no default ACL. The kernel then checks permissions
    /// itself, as with `default_permissions`.
    pub posix_acl: bool,
    /// Ask the kernel for FUSE over io_uring (it offers it when the
    /// `fuse.enable_uring` parameter is on).
    pub io_uring: bool,
    /// Let root switch the device's faults through `FAULT_XATTR`.
    pub faults: Option<Arc<foliofs::device::Faults>>,
    /// What the device under the engine reports of itself (an object
    /// image: its WAL lag and cache), as `device` in the counters.
    pub device_status: Option<DeviceStatus>,
}

/// A device's own report, for the counters (`FuseOptions::device_status`).
pub type DeviceStatus = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Engine errors to errnos, in one place. Corruption and device errors
/// met by a request are logged here; the engine itself logs each data
/// checksum failure and the shutdown when it happens (not every request
/// refused after it).
fn errno(e: Error) -> Errno {
    match &e {
        Error::Corrupted { .. } => log::error!("{e}"),
        Error::Io(_) => log::error!("{e}"),
        _ => {}
    }
    Errno::from_i32(e.errno())
}

fn time(t: (i64, u32)) -> SystemTime {
    if t.0 >= 0 {
        UNIX_EPOCH + Duration::new(t.0 as u64, t.1)
    } else {
        UNIX_EPOCH - Duration::new(t.0.unsigned_abs(), 0) + Duration::new(0, t.1)
    }
}

fn kind(k: FileType) -> fuser::FileType {
    match k {
        FileType::File => fuser::FileType::RegularFile,
        FileType::Dir => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::CharDev => fuser::FileType::CharDevice,
        FileType::BlockDev => fuser::FileType::BlockDevice,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.allocated.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.crtime),
        kind: kind(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The attributes of a negative entry: node id 0, nothing else read.
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(st) => {
            let (sec, nsec) = match st.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
                Err(e) => (-(e.duration().as_secs_f64().ceil() as i64), 0),
            };
            TimeSet::At(foliofs::format::inode::Timespec { sec, nsec })
        }
    }
}

impl FuseFs {
    /// The adapter for `fs`, with the kernel's cache, the space gate and
    /// the transport the session made for it (`session::Session::mount`).
    pub(crate) fn new(
        fs: Arc<Fs>,
        o: FuseOptions,
        kernel: KernelCache,
        space: SpaceGate,
        transport: Arc<Transport>,
    ) -> Self {
        FuseFs {
            fs,
            space,
            kernel,
            cache: o.cache,
            posix_acl: o.posix_acl,
            io_uring: o.io_uring,
            transport,
            mounted_at: None,
            no_opendir: false,
            killpriv: false,
            uncached_opens: AtomicU64::new(0),
            uncached_writes: AtomicU64::new(0),
            read_ahead_set: std::sync::Once::new(),
            faults: o.faults,
            device_status: o.device_status,
        }
    }

    /// FUSE's root is inode 1; so is the engine's.
    fn ino(&self, i: INodeNo) -> u64 {
        i.0
    }

    /// Reply with a node the kernel will count a lookup of: the engine
    /// holds it until the kernel forgets it (`forget`), so a file that
    /// loses its last name while the kernel still knows it (to flush its
    /// times, say) stays until then.
    fn entry(&self, r: foliofs::Result<Attr>, reply: ReplyEntry) {
        match r.and_then(|a| self.fs.hold(a.ino).map(|()| a)) {
            Ok(a) => {
                reply.entry_with_ttls(
                    &self.cache.attr_timeout,
                    &self.cache.entry_timeout,
                    &self.file_attr(&a),
                    Generation(a.generation as u64),
                );
                self.space.after_attr_reply(a.ino);
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Reply to CREATE or TMPFILE with a node just made and opened: held,
    /// like `entry`'s, and given a handle.
    fn created(&self, r: foliofs::Result<(Attr, OpenFile)>, flags: i32, reply: ReplyCreate) {
        let r = r.and_then(|(a, f)| match self.fs.hold(a.ino) {
            Ok(()) => Ok((a, f)),
            Err(e) => {
                let _ = self.fs.release_file(f);
                Err(e)
            }
        });
        match r {
            Ok((a, f)) => {
                let (fh, open) = self.new_handle(a.ino, flags, f);
                reply.created(
                    &self.cache.entry_timeout,
                    &self.file_attr(&a),
                    Generation(a.generation as u64),
                    FileHandle(fh),
                    open,
                )
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn attr_reply(&self, r: foliofs::Result<Attr>, reply: ReplyAttr) {
        match r {
            Ok(a) => {
                reply.attr(&self.cache.attr_timeout, &self.file_attr(&a));
                self.space.after_attr_reply(a.ino);
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// The attributes the kernel gets for `a`. With `-o direct_writes` a
    /// regular file's preferred I/O size (st_blksize) is the largest
    /// request, so that programs sizing their buffers by it (`cp`: the
    /// larger of it and 128 KiB) make each write's round trip to the
    /// daemon carry 1 MiB.
    fn file_attr(&self, a: &Attr) -> FileAttr {
        let mut f = file_attr(a);
        if self.cache.direct_writes && f.kind == fuser::FileType::RegularFile {
            f.blksize = MAX_WRITE;
        }
        f
    }

    /// A new description of `ino` and the open flags the kernel gets for
    /// it (`KernelCache::open`). O_DIRECT: uncached, so requests come as
    /// the caller made them. Opened for writing while the free space does
    /// not cover the kernel's cached writes (`SpaceGate::room_for_cache`):
    /// uncached too, through the engine's page cache, so ENOSPC reaches
    /// write(2).
    fn new_handle(&self, ino: u64, flags: i32, file: OpenFile) -> (u64, FopenFlags) {
        self.read_ahead_set.call_once(|| self.set_read_ahead());
        let odirect = flags & libc::O_DIRECT != 0;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let low =
            !odirect && writable && self.cache.writeback_cache && !self.space.room_for_cache();
        if low && self.uncached_opens.fetch_add(1, Ordering::Relaxed) == 0 {
            log::info!(
                "less than {} MiB free: files opened for writing now bypass the kernel's \
                 cache, so that ENOSPC reaches write()",
                self.space.floor() >> 20
            );
        }
        // chattr +S: every write must reach the engine, which makes it
        // durable before the reply.
        let sync = !odirect
            && writable
            && self.cache.writeback_cache
            && self.fs.getattr(ino).is_ok_and(|a| a.flags & FL_SYNC != 0);
        // `-o direct_writes`: every writer bypasses the kernel's cache.
        let direct = !odirect && writable && self.cache.direct_writes;
        let h = Handle {
            ino,
            uncached: odirect || low || sync || direct,
            odirect,
            writable,
            file,
        };
        // A read that updates the access time must reach the engine: the
        // kernel's cached pages are dropped at open when one is due.
        let readable = flags & libc::O_ACCMODE != libc::O_WRONLY;
        let atime_due = readable && !h.uncached && self.fs.atime_due(ino).unwrap_or(false);
        self.kernel
            .open(h, atime_due, || self.space.writer_opened(ino))
    }

    /// Raise the kernel's read-ahead for the mount to
    /// `CacheOptions::read_ahead` (never lower it); a mount by a user
    /// other than root keeps the kernel's.
    fn set_read_ahead(&self) {
        let want = self.cache.read_ahead;
        let Some(mp) = self.space.mount_point().filter(|_| want > 0) else {
            return;
        };
        match bdi::set_read_ahead(mp, want) {
            Ok(()) => log::debug!("read-ahead {} KiB", want >> 10),
            Err(e) => log::info!(
                "the kernel reads ahead 128 KiB of this mount's files: {} KiB asked ({e})",
                want >> 10
            ),
        }
    }

    /// Take set-ID bits and capabilities from `ino` for `req`'s caller
    /// (`Fs::kill_priv`); the kernel's cached mode is stale then (nothing
    /// refreshes it after a direct write or an fallocate), so it is told
    /// to ask again.
    fn kill_priv(&self, req: &Request, ino: u64) -> foliofs::Result<()> {
        if self.fs.kill_priv(ino, |gid| caller_in_group(req, gid))? {
            self.kernel.stale_attrs(ino);
        }
        Ok(())
    }

    /// fsync through the description when there is one, so a writeback
    /// error reaches each description's fsync once.
    fn fsync_fh(&self, ino: u64, fh: FileHandle, datasync: bool) -> Result<(), Error> {
        match self.kernel.handle(fh) {
            Some(h) => self.fs.fsync_file(&h.file, datasync),
            None => self.fs.fsync(ino, datasync),
        }
    }

    fn read_at(
        &self,
        ino: u64,
        direct: bool,
        offset: u64,
        size: usize,
    ) -> foliofs::Result<Vec<u8>> {
        self.read_into(ino, direct, offset, size, |r| r.map(<[u8]>::to_vec))
    }

    /// Read into this thread's aligned buffer (no allocation, no zeroing
    /// per request) and hand `f` what was read.
    fn read_into<R>(
        &self,
        ino: u64,
        direct: bool,
        offset: u64,
        size: usize,
        f: impl FnOnce(foliofs::Result<&[u8]>) -> R,
    ) -> R {
        let read = |buf: &mut [u8]| {
            let r = match self.direct_path(direct, offset, size) {
                Ok(true) => self.fs.read_direct(ino, offset, buf),
                Ok(false) => self.fs.read(ino, offset, buf),
                Err(e) => Err(e),
            };
            f(r.map(|n| &buf[..n]))
        };
        // Served from a ring: the engine reads straight into the payload
        // the reply goes out from.
        match uring::reply_space(size) {
            // SAFETY: the payload is this thread's until it replies, which
            // `f` does last; nothing else holds a view of it.
            Some(p) => read(unsafe { std::slice::from_raw_parts_mut(p, size) }),
            None => with_aligned(size, read),
        }
    }

    /// Whether a request on a description takes the engine's direct path,
    /// by the kernel's rule for O_DIRECT on its own file systems over a
    /// disk of 512-byte sectors, which the C ABI follows too: an offset or
    /// a length not in whole sectors is refused (EINVAL); whole blocks of
    /// the engine take its direct path; whole sectors that are not whole
    /// blocks go through the engine's page cache, which is coherent with
    /// its direct path (the same data, checksummed the same way, made
    /// durable by fsync as any write is). The caller's buffer is the
    /// kernel's to check: it never reaches the daemon. Requests on other
    /// descriptions (`direct` false) take the page cache.
    fn direct_path(&self, direct: bool, offset: u64, len: usize) -> foliofs::Result<bool> {
        if !direct {
            return Ok(false);
        }
        if (offset | len as u64) % DIRECT_IO_SECTOR != 0 {
            return Err(Error::Invalid(format!(
                "O_DIRECT needs an offset and a length in whole {DIRECT_IO_SECTOR}-byte \
                 sectors (offset {offset}, length {len})"
            )));
        }
        let bs = self.fs.block_size();
        Ok(offset % bs == 0 && len as u64 % bs == 0)
    }

    fn write_at(&self, ino: u64, direct: bool, offset: u64, data: &[u8]) -> foliofs::Result<usize> {
        if self.direct_path(direct, offset, data.len())? {
            // The request buffer is not aligned for the device: copy once.
            with_aligned(data.len(), |buf| {
                buf.copy_from_slice(data);
                self.fs.write_direct(ino, offset, buf)
            })
        } else {
            self.fs.write(ino, offset, data)
        }
    }

    /// chattr through the kernel (FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR):
    /// the kernel's vfs_fileattr_set has checked that the caller owns the
    /// inode and, for immutable and append-only, holds
    /// CAP_LINUX_IMMUTABLE. Before a file turns immutable, the writes the
    /// kernel still caches for it are written back (they were accepted
    /// before it was frozen); afterwards the engine refuses them. The
    /// same before a file turns synchronous (+S): its later opens bypass
    /// the kernel's cache (`new_handle`), while descriptions open already
    /// keep writing through it until they are closed. `new` gives the
    /// flags from the ones the inode has.
    fn set_flags(&self, ino: u64, new: impl FnOnce(u32) -> u32) -> foliofs::Result<()> {
        let was = self.fs.getattr(ino)?.flags;
        let flags = new(was);
        if flags & !was & (FL_IMMUTABLE | FL_SYNC) != 0 {
            self.kernel.kernel_drop(ino, 0, 0);
            self.fs.fsync(ino, true)?;
        }
        self.fs.set_flags(ino, flags, true)?;
        // The change time moved: the kernel's cached one is stale.
        self.kernel.stale_attrs(ino);
        Ok(())
    }

    fn counters_json(&self) -> Vec<u8> {
        let mut c = serde_json::to_value(self.fs.counters()).unwrap_or_default();
        if let Some(m) = c.as_object_mut() {
            // For `foliofs stat --mount`'s page: how requests arrive, how
            // long the mount has been up (rates since mount), the cache now.
            let rings = self.transport.rings();
            m.insert(
                "fuse_transport".into(),
                if rings { "io_uring" } else { "/dev/fuse" }.into(),
            );
            let up = self.mounted_at.map_or(0.0, |t| t.elapsed().as_secs_f64());
            m.insert("mounted_secs".into(), up.into());
            let cache = self.fs.cache_stats();
            m.insert("cached_bytes".into(), cache.cached_bytes.into());
            m.insert("dirty_bytes".into(), cache.dirty_bytes.into());
            m.insert(
                "fuse_ring_requests".into(),
                self.transport.ring_requests().into(),
            );
            m.insert(
                "fuse_idle_replies".into(),
                self.transport.idle_replies().into(),
            );
            m.insert(
                "fuse_idle_rescues".into(),
                self.transport.idle_rescues().into(),
            );
            m.insert(
                "fuse_uncached_opens".into(),
                self.uncached_opens.load(Ordering::Relaxed).into(),
            );
            m.insert(
                "fuse_uncached_writes".into(),
                self.uncached_writes.load(Ordering::Relaxed).into(),
            );
            m.insert("fuse_enospc_gated".into(), self.space.refused().into());
            if let Some(status) = &self.device_status {
                m.insert("device".into(), status());
            }
            m.insert(
                "fuse_kernel_drops".into(),
                self.kernel.drops().had.load(Ordering::Relaxed).into(),
            );
            m.insert(
                "fuse_kernel_drops_skipped".into(),
                self.kernel.drops().skipped.load(Ordering::Relaxed).into(),
            );
            m.insert(
                "fuse_threads_added".into(),
                self.kernel.drops().added.load(Ordering::Relaxed).into(),
            );
        }
        let mut v = serde_json::to_vec_pretty(&c).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

/// The kernel did not offer FUSE over io_uring at INIT. Where it has the
/// rings but they are switched off, say how to switch them on: the mount
/// then serves /dev/fuse, slower for small requests (docs/BENCH-RESULTS.md).
fn uring_refused() {
    const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
    match std::fs::read_to_string(PARAM) {
        Ok(v) if v.trim() == "N" => log::warn!(
            "FUSE over io_uring is off in this kernel ({PARAM} is N): serving /dev/fuse; \
             to use the rings, as root `echo Y > {PARAM}` and mount again, and for the \
             next boot `options fuse enable_uring=1` in /etc/modprobe.d (or \
             fuse.enable_uring=1 on the kernel command line where fuse is built in)"
        ),
        Ok(_) => log::info!("the kernel did not offer FUSE over io_uring: serving /dev/fuse"),
        Err(_) => log::info!("this kernel has no FUSE over io_uring: serving /dev/fuse"),
    }
}

/// Where the kernel caps requests below `max_pages()`, say what that
/// costs and how to lift it.
fn split_writes_note() {
    let want = max_pages();
    if let Some(limit) = std::fs::read_to_string(MAX_PAGES_LIMIT)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|&l| l < u32::from(want))
    {
        log::info!(
            "{MAX_PAGES_LIMIT} is {limit}: a {} KiB write from a buffer not aligned to a page \
             reaches the file system as two requests; as root `echo {want} > {MAX_PAGES_LIMIT}` \
             (or `sysctl fs.fuse.max_pages_limit={want}`) and mount again",
            MAX_WRITE >> 10
        );
    }
}

fn done(r: foliofs::Result<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// Run `f` on an aligned buffer of `len` bytes, this thread's own, kept
/// between requests: a direct request must not map and zero a fresh buffer
/// each time. Its contents on entry are whatever the last request left.
fn with_aligned<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    thread_local! {
        static BUF: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::zeroed(0));
    }
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < len {
            *b = AlignedBuf::zeroed(len.next_power_of_two());
        }
        f(&mut b[..len])
    })
}

fn data_reply(r: foliofs::Result<Vec<u8>>, reply: ReplyData) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(errno(e)),
    }
}

/// Reply to getxattr/listxattr: the size when asked for it, ERANGE when
/// the buffer is too small.
fn xattr_reply(data: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if (size as usize) < data.len() {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.mounted_at = Some(Instant::now());
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_pages(max_pages());
        split_writes_note();
        let _ = config.set_max_background(self.cache.max_background);
        let _ = config.set_congestion_threshold(self.cache.max_background / 4 * 3);
        // Each one alone: a kernel that lacks one still gets the others.
        // With it the kernel also writes back the range of a direct read
        // or write before sending it (Linux 6.6+; `kernel_writeback`).
        self.kernel.set_dio_writeback(
            config
                .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
                .is_ok(),
        );
        for cap in [
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_ASYNC_DIO,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_EXPORT_SUPPORT,
        ] {
            let _ = config.add_capabilities(cap);
        }
        // The engine takes suid/sgid and capabilities on write, truncate
        // and chown (`Fs::kill_priv`): the kernel then need not ask for
        // security.capability before every write.
        if config
            .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            .is_ok()
        {
            self.killpriv = true;
        }
        if config
            .add_capabilities(InitFlags::FUSE_NO_OPENDIR_SUPPORT)
            .is_ok()
        {
            self.no_opendir = true;
        }
        if self.io_uring {
            match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
                Ok(()) => self.transport.set_rings(),
                Err(_) => uring_refused(),
            }
        }
        if self.cache.readdirplus {
            let _ = config.add_capabilities(
                InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
            );
        }
        if self.posix_acl
            && config
                .add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK)
                .is_err()
        {
            log::warn!("the kernel does not offer FUSE_POSIX_ACL: ACLs are stored, not enforced");
        }
        if self.cache.writeback_cache
            && config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .is_err()
        {
            log::warn!("the kernel does not offer FUSE_WRITEBACK_CACHE: writes go through");
        }
        Ok(())
    }

    /// With FUSE_EXPORT_SUPPORT the kernel looks up "." in any inode, a
    /// file's too, to find one by number when a file handle
    /// (open_by_handle_at, an NFS export) names an inode it no longer
    /// holds; it checks the generation itself (ESTALE for a reused one).
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let parent = self.ino(parent);
        let r = if name.as_bytes() == b"." {
            self.fs.getattr(parent)
        } else {
            self.fs.lookup(parent, name.as_bytes())
        };
        match r {
            // A missing name is cached too: node id 0.
            Err(Error::NotFound) if !self.cache.negative_timeout.is_zero() => reply
                .entry_with_ttls(
                    &Duration::ZERO,
                    &self.cache.negative_timeout,
                    &negative_attr(),
                    Generation(0),
                ),
            r => self.entry(r, reply),
        }
    }

    /// The kernel dropped `nlookup` lookups of `ino`.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if let Err(e) = self.fs.unhold(self.ino(ino), nlookup) {
            log::warn!("forget of inode {}: {e}", ino.0);
        }
    }

    /// A GETATTR naming a description comes from the kernel's own
    /// refresh before a read or write through it; one through a cached
    /// writable description while the space kept for the kernel's cached
    /// writes is short, or the file system is shut down, is a write to
    /// refuse (`space`).
    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let ino = self.ino(ino);
        let cached_writer = fh
            .and_then(|fh| self.kernel.handle(fh))
            .is_some_and(|h| h.writable && !h.uncached);
        if cached_writer && self.cache.writeback_cache {
            if let Err(e) = self.space.check_write(ino) {
                return reply.error(e);
            }
        }
        self.attr_reply(self.fs.getattr(ino), reply)
    }

    /// statx asking for the birth time: the attributes and the inode's
    /// creation time, which the kernel then keeps with the attributes it
    /// caches (stat(1)'s "Birth", statx's STATX_BTIME).
    fn statx(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        match self.fs.getattr(self.ino(ino)) {
            Ok(a) => {
                reply.statx(&self.cache.attr_timeout, &self.file_attr(&a));
                self.space.after_attr_reply(a.ino);
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// With FUSE_HANDLE_KILLPRIV_V2 the engine, not the kernel, takes
    /// set-user-ID, set-group-ID (when group-executable) and the file
    /// capability from a regular file on chown and on a truncate by an
    /// unprivileged caller (the kernel's FATTR_KILL_SUIDGID, which fuser
    /// does not pass on: a caller other than root stands for one without
    /// CAP_FSETID). An explicit mode in the same request wins.
    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            ctime: ctime.map(|t| time_set(TimeOrNow::SpecificTime(t))),
            kill_priv: self.killpriv
                && (uid.is_some() || gid.is_some() || (size.is_some() && req.uid() != 0)),
        };
        self.attr_reply(self.fs.setattr(self.ino(ino), &set), reply)
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        data_reply(self.fs.readlink(self.ino(ino)), reply)
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(k) = FileType::from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        let r = self.fs.mknod(
            self.ino(parent),
            name.as_bytes(),
            &NewNode {
                umask,
                rdev,
                ..NewNode::new(k, mode & 0o7777, req.uid(), req.gid())
            },
        );
        self.entry(r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.fs.mknod(
            self.ino(parent),
            name.as_bytes(),
            &NewNode {
                umask,
                ..NewNode::new(FileType::Dir, mode & 0o7777, req.uid(), req.gid())
            },
        );
        self.entry(r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(self.fs.unlink(self.ino(parent), name.as_bytes()), reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(self.fs.rmdir(self.ino(parent), name.as_bytes()), reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.fs.symlink(
            self.ino(parent),
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
            req.uid(),
            req.gid(),
        );
        self.entry(r, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut f = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            f |= foliofs::fs::RENAME_NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            f |= foliofs::fs::RENAME_EXCHANGE;
        }
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            // (The kernel has checked CAP_MKNOD.)
            return done(
                self.fs.rename_whiteout(
                    (self.ino(parent), name.as_bytes()),
                    (self.ino(newparent), newname.as_bytes()),
                    f,
                    (req.uid(), req.gid()),
                ),
                reply,
            );
        }
        done(
            self.fs.rename(
                self.ino(parent),
                name.as_bytes(),
                self.ino(newparent),
                newname.as_bytes(),
                f,
            ),
            reply,
        )
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self
            .fs
            .link(self.ino(ino), self.ino(newparent), newname.as_bytes());
        self.entry(r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let ino = self.ino(ino);
        match self.fs.open_file(ino) {
            Ok((a, f)) if a.kind == FileType::Dir => {
                let _ = self.fs.release_file(f);
                reply.error(Errno::EISDIR)
            }
            Ok((a, f)) if !open_allowed(a.flags, flags.0) => {
                let _ = self.fs.release_file(f);
                reply.error(Errno::EPERM)
            }
            Ok((_, f)) => {
                let (fh, open) = self.new_handle(ino, flags.0, f);
                reply.opened(FileHandle(fh), open)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self
            .fs
            .mknod(
                self.ino(parent),
                name.as_bytes(),
                &NewNode {
                    umask,
                    ..NewNode::new(FileType::File, mode & 0o7777, req.uid(), req.gid())
                },
            )
            .and_then(|a| self.fs.open_file(a.ino));
        self.created(r, flags, reply);
    }

    /// O_TMPFILE: an unnamed file, open, that `link` may name later
    /// (the kernel refuses that when it was opened with O_EXCL).
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EINVAL);
        }
        let r = self
            .fs
            .tmpfile(self.ino(parent), mode & 0o7777, umask, req.uid(), req.gid());
        self.created(r, flags, reply);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let ino = self.ino(ino);
        // The kernel names the owner (FUSE_READ_LOCKOWNER) on the reads it
        // passes through (fuse_direct_io), never on page-cache fills. A
        // fill can come through an O_DIRECT handle (a MAP_PRIVATE mapping
        // of a file opened so) and holds its pages locked: it is a cached
        // read, and must not wait for the kernel to drop those pages.
        let uncached = match lock_owner {
            Some(_) => self.kernel.uncached(fh, ino, false),
            None => None,
        };
        self.kernel.direct_writeback(ino, uncached);
        let odirect = uncached.is_some_and(|u| u.odirect);
        let size = size as usize;
        // A direct read that meets the engine's end of file may be short
        // of the kernel's, which cached writes past it moved: once those
        // are written back, it reads again.
        // (Without the kernel's range writeback, `direct_writeback` has
        // written back the whole file already.)
        let past_eof = |n: usize| {
            n < size
                && self.kernel.dio_writeback()
                && self.cache.writeback_cache
                && uncached.is_some_and(|u| u.cached_writable)
        };
        let retry = self.read_into(ino, odirect, offset, size, |r| match r {
            Ok(d) if past_eof(d.len()) => Some(reply),
            Ok(d) => {
                reply.data(d);
                None
            }
            Err(e) => {
                reply.error(errno(e));
                None
            }
        });
        if let Some(reply) = retry {
            self.kernel.kernel_writeback(ino, true, offset);
            self.read_into(ino, odirect, offset, size, |r| match r {
                Ok(d) => reply.data(d),
                Err(e) => reply.error(errno(e)),
            })
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let ino = self.ino(ino);
        // The kernel writes its cached pages back through any writable
        // handle, an O_DIRECT one included: those go to the page cache path.
        let from_cache = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let uncached = if from_cache {
            None
        } else {
            self.uncached_writes.fetch_add(1, Ordering::Relaxed);
            self.kernel.uncached(fh, ino, true)
        };
        // An unprivileged writer takes suid/sgid and capabilities.
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.kill_priv(req, ino) {
                return reply.error(errno(e));
            }
        }
        self.kernel.direct_writeback(ino, uncached);
        let r = if from_cache {
            // The kernel takes its writeback as done whatever count comes
            // back: all of it goes in, or an error.
            let r = self.fs.write_cached(ino, offset, data).map(|()| data.len());
            self.space.after_writeback();
            r
        } else {
            self.write_at(ino, uncached.is_some_and(|u| u.odirect), offset, data)
        };
        let r = r.and_then(|n| {
            // The kernel's cached pages of the range are stale now:
            // those of a description open now, or open during the
            // write (xfstests generic/451: buffered readers racing
            // direct writes read old data after the write returned).
            if uncached.is_some() && n > 0 && self.kernel.bypass_done(ino) {
                self.kernel.kernel_drop(ino, offset as i64, n as i64);
            }
            // O_SYNC / O_DSYNC: durable before the reply (after its
            // own writeback the kernel asks for an fsync itself).
            if !from_cache && flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0 {
                self.fsync_fh(ino, fh, flags.0 & libc::O_SYNC == 0)?;
            }
            Ok(n)
        });
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => {
                // A refused writeback (no room, a device error, a file
                // made immutable after the kernel cached the write): the
                // writer learns of it at its next fsync or close, as of
                // any writeback error (the kernel's errseq, once per
                // description), and the kernel's pages, which hold what
                // the file does not, are dropped once the reply has ended
                // their writeback (which waits for the reply: not here),
                // so that readers see what the file holds.
                if from_cache {
                    if !matches!(e, foliofs::Error::NotPermitted(_)) {
                        log::warn!(
                            "inode {ino}: the kernel's writeback of {} bytes at offset {offset} \
                             failed: {e} (errno {}); reported at the next fsync of each open \
                             description",
                            data.len(),
                            e.errno()
                        );
                    }
                    self.kernel
                        .queue_drop(ino, offset as i64, data.len() as i64);
                }
                reply.error(errno(e));
            }
        }
    }

    /// Nothing for the engine to do at each close (data and errors go by
    /// fsync and the description's release; locks are the kernel's):
    /// ENOSYS, after which the kernel sends no more FLUSH, one round trip
    /// less per close.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let file = self.kernel.close(fh, |ino| self.space.writer_closed(ino));
        let r = match file {
            Some(f) => self.fs.release_file(f),
            None => self.fs.release(self.ino(ino)),
        };
        done(r, reply)
    }

    /// FIBMAP (filefrag, xfstests' extent checks). Linux asks only a
    /// fuseblk mount (a block device), in its `blocksize` units: the
    /// device block that holds file block `idx`, 0 for a hole or an
    /// unwritten block. Cached data is written back first, as Linux's own
    /// file systems do (iomap_bmap).
    fn bmap(&self, _req: &Request, ino: INodeNo, blocksize: u32, idx: u64, reply: ReplyBmap) {
        let bs = self.fs.block_size();
        let at = idx.saturating_mul(u64::from(blocksize));
        match self.fs.block_at(self.ino(ino), at) {
            Ok(b) => {
                let dev = b.map_or(0, |b| b * bs + at % bs);
                reply.bmap(dev / u64::from(blocksize.max(1)))
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        done(self.fsync_fh(self.ino(ino), fh, datasync), reply)
    }

    /// syncfs(2) and sync(1) on a fuseblk mount (a block device mounted by
    /// root): write back and commit everything, as `foliofs sync` does.
    /// The kernel has written back its own cached writes first.
    fn syncfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyEmpty) {
        done(self.fs.sync(), reply)
    }

    /// With FUSE_NO_OPENDIR_SUPPORT the first opendir answers ENOSYS and
    /// the kernel sends no more opendir or releasedir (two round trips
    /// less per listing) and caches listings itself: an open directory is
    /// held by the kernel's lookup of it (`entry`), so one removed or
    /// replaced by rename while open still lives until it is closed.
    /// Otherwise an open directory counts as an open in the engine.
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            return reply.error(Errno::ENOSYS);
        }
        let ino = self.ino(ino);
        match self.fs.open(ino) {
            Ok(a) if a.kind == FileType::Dir => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(_) => {
                let _ = self.fs.release(ino);
                reply.error(Errno::ENOTDIR)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        done(self.fs.release(self.ino(ino)), reply)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = listing(
            offset,
            |c| self.fs.readdir(self.ino(ino), c, 128),
            |e| {
                let full = reply.add(
                    INodeNo(e.ino),
                    e.cookie,
                    kind(e.kind),
                    OsStr::from_bytes(&e.name),
                );
                (full, e.cookie)
            },
        );
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Entries with their attributes, so that `ls -l` or a walk needs no
    /// lookup per name (the kernel asks for this when it helps:
    /// FUSE_READDIRPLUS_AUTO).
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = listing(
            offset,
            |c| self.fs.readdir_attrs(self.ino(ino), c, 64),
            |(e, a)| {
                let full = reply.add(
                    INodeNo(e.ino),
                    e.cookie,
                    OsStr::from_bytes(&e.name),
                    &self.cache.entry_timeout,
                    &self.file_attr(&a),
                    Generation(a.generation as u64),
                );
                // The kernel counts a lookup of each entry but "." and "..".
                if !full && e.name != b"." && e.name != b".." {
                    if let Err(err) = self.fs.hold(e.ino) {
                        log::debug!("readdirplus: holding inode {}: {err}", e.ino);
                    }
                }
                (full, e.cookie)
            },
        );
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        done(self.fsync_fh(self.ino(ino), fh, datasync), reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if name == COUNTERS_XATTR {
            return reply.error(Errno::EPERM);
        }
        let ino = self.ino(ino);
        if name == FAULT_XATTR && ino == self.fs.root_ino() {
            return match (&self.faults, req.uid()) {
                (None, _) => reply.error(Errno::ENOTSUP),
                (Some(_), uid) if uid != 0 => reply.error(Errno::EPERM),
                (Some(f), _) => match f.set(&String::from_utf8_lossy(value)) {
                    Ok(()) => {
                        log::warn!("faults injected: {}", String::from_utf8_lossy(value));
                        reply.ok()
                    }
                    Err(e) => {
                        log::warn!("{e}");
                        reply.error(Errno::EINVAL)
                    }
                },
            };
        }
        // An access ACL set from outside the file's group takes
        // set-group-ID (xfstests generic/375). The kernel asks for this
        // with FUSE_SETXATTR_ACL_KILL_SGID, which needs FUSE_SETXATTR_EXT,
        // which fuser does not parse: root stands for CAP_FSETID here.
        let in_group = |gid| req.uid() == 0 || caller_in_group(req, gid);
        done(
            self.fs
                .setxattr_by(ino, name.as_bytes(), value, flags as u32, in_group),
            reply,
        )
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let ino = self.ino(ino);
        if name == COUNTERS_XATTR && ino == self.fs.root_ino() {
            return xattr_reply(&self.counters_json(), size, reply);
        }
        match self.fs.getxattr(ino, name.as_bytes()) {
            Ok(v) => xattr_reply(&v, size, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(self.ino(ino)) {
            Ok(names) => {
                let mut out = Vec::new();
                for n in names {
                    out.extend_from_slice(&n);
                    out.push(0);
                }
                xattr_reply(&out, size, reply)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(self.fs.removexattr(self.ino(ino), name.as_bytes()), reply)
    }

    /// FOLIOFS_IOC_SYNC; any other command is not one of ours (ENOTTY).
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let ino = self.ino(ino);
        let word = |i: usize| u32::from_ne_bytes(in_data[i..i + 4].try_into().unwrap());
        let r: foliofs::Result<Vec<u8>> = match cmd {
            FOLIOFS_IOC_SYNC => self.fs.sync().map(|()| Vec::new()),
            // The flag (XFS's flush-the-log-or-not) does not reach a FUSE
            // server (an _IOR ioctl passes nothing in): the log is
            // flushed, the cached data is not.
            FS_IOC_SHUTDOWN if req.uid() != 0 => Err(Error::NotPermitted(
                "shutting the file system down is root's",
            )),
            FS_IOC_SHUTDOWN => self.fs.shutdown(true).map(|()| Vec::new()),
            FOLIOFS_IOC_GET_SYNC_MODE => {
                let (sync, dirsync) = self.fs.sync_mode();
                Ok((sync as u32 | (dirsync as u32) << 1).to_ne_bytes().to_vec())
            }
            FOLIOFS_IOC_SET_SYNC_MODE if req.uid() != 0 => Err(Error::NotPermitted(
                "changing the mount's sync options is root's",
            )),
            FOLIOFS_IOC_SET_SYNC_MODE if in_data.len() >= 4 => {
                let mode = word(0);
                self.fs.set_sync_mode(mode & 1 != 0, mode & 2 != 0);
                Ok(Vec::new())
            }
            FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => {
                self.fs.getattr(ino).map(|a| a.flags.to_ne_bytes().to_vec())
            }
            FS_IOC_FSGETXATTR => self.fs.getattr(ino).map(|a| {
                let mut x = vec![0u8; FSXATTR_SIZE];
                x[..4].copy_from_slice(&xflags_of(a.flags).to_ne_bytes());
                x
            }),
            FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS if in_data.len() >= 4 => {
                self.set_flags(ino, |_| word(0)).map(|()| Vec::new())
            }
            // Extent size hints and project IDs: not kept.
            // Dirsync, which no xflag stands for, stays as it was.
            FS_IOC_FSSETXATTR if in_data.len() >= FSXATTR_SIZE => match flags_of_xflags(word(0)) {
                Some(flags) if word(4) == 0 && word(12) == 0 && word(16) == 0 => self
                    .set_flags(ino, |was| flags | (was & FL_DIRSYNC))
                    .map(|()| Vec::new()),
                _ => Err(Error::Unsupported(
                    "these xflags, extent size hints or project IDs",
                )),
            },
            _ => return reply.error(Errno::ENOTTY),
        };
        match r {
            Ok(out) => reply.ioctl(0, &out),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// The kernel checks modes and ACLs itself (default_permissions);
    /// without it, access(2) is allowed as the kernel allows it after
    /// ENOSYS, which also stops it asking again.
    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let m = match Falloc::from_linux(mode) {
            Ok(m) => m,
            Err(e) => return reply.error(errno(e)),
        };
        let ino = self.ino(ino);
        // As a write does: a caller other than root (one without
        // CAP_FSETID) takes the set-ID bits (xfstests generic/683-685).
        if req.uid() != 0 {
            if let Err(e) = self.kill_priv(req, ino) {
                return reply.error(errno(e));
            }
        }
        done(self.fs.fallocate(ino, m, offset, length), reply)
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let w = match whence {
            libc::SEEK_DATA => Whence::Data,
            libc::SEEK_HOLE => Whence::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        if offset < 0 {
            return reply.error(Errno::ENXIO);
        }
        let ino = self.ino(ino);
        // What lies before `offset` moves neither answer.
        self.kernel
            .kernel_writeback(ino, self.kernel.cached_opens(ino).1, offset as u64);
        match self.fs.seek(ino, offset as u64, w) {
            Ok(Some(o)) => reply.offset(o as i64),
            Ok(None) => reply.error(Errno::ENXIO),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // A copy inside the engine: no trip through the kernel's buffers.
        let len = len.min(u32::MAX as u64 & !0xFFFF);
        let (din, dout) = (
            self.kernel.is_odirect(fh_in),
            self.kernel.is_odirect(fh_out),
        );
        let mut done = 0u64;
        while done < len {
            let chunk = (len - done).min(MAX_WRITE as u64) as usize;
            let data = match self.read_at(self.ino(ino_in), din, offset_in + done, chunk) {
                Ok(d) => d,
                Err(e) => return reply.error(errno(e)),
            };
            if data.is_empty() {
                break;
            }
            self.kernel.bypass(self.ino(ino_out));
            if let Err(e) = self.write_at(self.ino(ino_out), dout, offset_out + done, &data) {
                return reply.error(errno(e));
            }
            done += data.len() as u64;
            if data.len() < chunk {
                break;
            }
        }
        // Marked again once done: an open during the copy took the mark.
        self.kernel.bypass(self.ino(ino_out));
        reply.written(done as u32)
    }
}

//! `foliofs mount IMAGE DIR [-o OPTIONS] [-f]`, the same as the
//! `mount.fuse.foliofs` helper that mount(8) and /etc/fstab call, and
//! `foliofs umount DIR`.
//!
//! Without -f the command starts a copy of itself in the background
//! (`--foreground`, its own session) and returns once that copy has
//! mounted, or prints why it could not. The mounted process unmounts
//! cleanly on SIGTERM, SIGINT or SIGHUP, and when the mount point is
//! unmounted from outside, writing everything back first.
//!
//! The daemon owns the image from before it mounts until after its last
//! write and close (see `foliofs::device::lock`): a second mount, fsck or
//! mkfs of a mounted image fails at once, and one that comes right after
//! umount(8) waits for the daemon to finish instead of reading a
//! half-written image. `foliofs umount DIR` unmounts and returns only once
//! the daemon has finished and the image is clean.
//!
//! A mount made by root serves every user (allow_other), with the kernel
//! checking permissions and POSIX ACLs (default_permissions), as fuse2fs
//! does; `-o noallow_other` keeps it to root.

use crate::logging;
use anyhow::{bail, Context, Result};
use foliofs::device::lock;
use foliofs::device::{DeviceOptions, FileDevice};
use foliofs::fs::ENGINE_OPTIONS;
use foliofs::{Fs, MountOptions};
use foliofs_fuse::session::{Serve, Session};
use foliofs_fuse::{CacheFloor, CacheOptions, FuseOptions};
use fuser::{Config, MountOption, SessionACL};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// Parsed `-o` options.
#[derive(Debug, Clone)]
pub struct Options {
    pub engine: MountOptions,
    /// None: on for root (the mount serves every user), off otherwise.
    pub allow_other: Option<bool>,
    pub allow_root: bool,
    pub default_permissions: bool,
    pub threads: usize,
    /// What the kernel may cache: `-o writeback_cache|no_writeback_cache,
    /// attr_timeout=S, entry_timeout=S, negative_timeout=S, max_background=N,
    /// read_ahead=SIZE`.
    pub cache: CacheOptions,
    /// FUSE over io_uring when the kernel offers it (`-o io_uring=on|off`),
    /// with `ring_depth` serving threads per CPU queue.
    pub io_uring: bool,
    pub ring_depth: usize,
    /// Replies to quick requests sent from SCHED_IDLE, so that the caller
    /// wakes on the ring thread's CPU (`-o idle_reply=on|off`).
    pub idle_reply: bool,
    /// `-o log=FILE`: the daemon logs there instead of syslog/stderr.
    pub log_file: Option<PathBuf>,
    pub log_level: log::LevelFilter,
    /// The per-mount flags: device files and set-ID bits honoured (`dev`,
    /// `suid`; off by default, as libfuse has them, on for root through
    /// the mount(8) helper, `helper_defaults`), programs not run (`noexec`).
    pub dev: bool,
    pub suid: bool,
    pub noexec: bool,
    /// `-o fault_injection` (tests): the image under a device whose
    /// writes, flushes or reads root can make fail while mounted, through
    /// the `foliofs.fault` xattr of the mount's root.
    pub fault_injection: bool,
    /// An object image's options (`foliofs_object::MOUNT_OPTIONS`):
    /// `takeover` claims one whose manifest names another writer (one
    /// that died, or one to be fenced); its cache directory, durability.
    pub object: foliofs_object::ObjectOptions,
    /// Which of those were given (refused for an image file).
    pub object_given: Vec<String>,
    /// `cache_size=SIZE` as given: the engine's metadata cache for an
    /// image file, the cache directory's size for an object image
    /// (`object_image`), as the C ABI and the library take it.
    cache_size: Option<u64>,
}

impl Options {
    /// The image is an object image: `cache_size` is its cache
    /// directory's, and the metadata cache keeps its default.
    pub fn object_image(&mut self) {
        if let Some(n) = self.cache_size.take() {
            self.object.cache_size = n;
            self.engine.meta_cache_bytes = MountOptions::default().meta_cache_bytes;
        }
    }

    /// allow_other as it applies to this process: root mounts serve every
    /// user unless told otherwise.
    pub fn allow_other(&self) -> bool {
        // SAFETY: geteuid has no preconditions.
        self.allow_other.unwrap_or(unsafe { libc::geteuid() } == 0) && !self.allow_root
    }
}

/// Options mount(8) passes along that mean nothing to foliofs.
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "_netdev",
    "nofail",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
];

pub fn parse_options(list: &[String]) -> Result<Options> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get() * 4)
        .unwrap_or(8)
        .clamp(4, 32);
    let mut o = Options {
        // The kernel caches what the mount serves: the engine keeps no
        // second copy of what it has written back.
        engine: MountOptions {
            drop_behind: true,
            direct_read_ahead: true,
            ..MountOptions::default()
        },
        allow_other: None,
        allow_root: false,
        default_permissions: true,
        threads,
        cache: CacheOptions::default(),
        io_uring: true,
        ring_depth: 4,
        idle_reply: true,
        log_file: None,
        log_level: log::LevelFilter::Info,
        dev: false,
        suid: false,
        noexec: false,
        fault_injection: false,
        object: Default::default(),
        object_given: Vec::new(),
        cache_size: None,
    };
    for opt in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (k, v) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        match o.engine.set(k, v) {
            Ok(true) if k == "cache_size" => {
                o.cache_size = Some(o.engine.meta_cache_bytes);
                continue;
            }
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => bail!("-o {e}"),
        }
        if k == "chunk_size" {
            bail!("-o chunk_size: an image's chunk size is chosen when it is made (foliofs mkfs URL --chunk-size SIZE)");
        }
        if o.object.set(k, v).map_err(|e| anyhow::anyhow!("-o {e}"))? {
            o.object_given.push(k.to_string());
            continue;
        }
        match (k, v) {
            ("allow_other", None) => o.allow_other = Some(true),
            ("noallow_other", None) => o.allow_other = Some(false),
            ("log", Some(f)) if !f.is_empty() => o.log_file = Some(absolute(Path::new(f))?),
            ("log_level", Some(l)) => o.log_level = logging::parse_level(l)?,
            ("allow_root", None) => o.allow_root = true,
            ("dev", None) => o.dev = true,
            ("nodev", None) => o.dev = false,
            ("suid", None) => o.suid = true,
            ("nosuid", None) => o.suid = false,
            ("exec", None) => o.noexec = false,
            ("noexec", None) => o.noexec = true,
            ("fault_injection", None) => o.fault_injection = true,
            ("default_permissions", None) => o.default_permissions = true,
            ("no_default_permissions", None) => o.default_permissions = false,
            ("writeback_cache", None) => o.cache.writeback_cache = true,
            ("no_writeback_cache", None) => o.cache.writeback_cache = false,
            ("direct_writes", None | Some("on")) => o.cache.direct_writes = true,
            ("direct_writes", Some("off")) => o.cache.direct_writes = false,
            ("io_uring", Some("on")) => o.io_uring = true,
            ("io_uring", Some("off")) => o.io_uring = false,
            ("ring_depth", Some(v)) => o.ring_depth = number(k, v, 1..=64)?,
            ("idle_reply", Some("on")) => o.idle_reply = true,
            ("idle_reply", Some("off")) => o.idle_reply = false,
            ("readdirplus", None) => o.cache.readdirplus = true,
            ("no_readdirplus", None) => o.cache.readdirplus = false,
            ("attr_timeout", Some(v)) => o.cache.attr_timeout = seconds(k, v)?,
            ("entry_timeout", Some(v)) => o.cache.entry_timeout = seconds(k, v)?,
            ("negative_timeout", Some(v)) => o.cache.negative_timeout = seconds(k, v)?,
            ("max_background", Some(v)) => o.cache.max_background = number(k, v, 1..=u16::MAX)?,
            ("read_ahead", Some(v)) => {
                o.cache.read_ahead = foliofs::fs::parse_size(v)
                    .ok()
                    .filter(|b| *b <= 1 << 30)
                    .ok_or_else(|| anyhow::anyhow!("-o {k}={v}: a size up to 1G (0: the kernel's)"))?
            }
            // `uncached_below`, its name before it also sized the floor.
            ("cache_floor" | "uncached_below", Some("auto")) => o.cache.cache_floor = CacheFloor::Auto,
            ("cache_floor" | "uncached_below", Some(v)) => {
                o.cache.cache_floor = CacheFloor::Bytes(
                    foliofs::fs::parse_size(v).map_err(|e| anyhow::anyhow!("-o {k}={v}: {e}"))?,
                )
            }
            ("threads", Some(v)) => o.threads = number(k, v, 1..=256)?,
            (k, None) if IGNORED.contains(&k) => {}
            (k, _) if k.starts_with("x-") || k == "comment" || k == "fsname" || k == "subtype" => {}
            _ => bail!(
                "unknown mount option '{opt}' (known: {ENGINE_OPTIONS}, allow_other, \
                 noallow_other, allow_root, dev, nodev, suid, nosuid, exec, noexec, \
                 default_permissions, no_default_permissions, \
                 writeback_cache, no_writeback_cache, direct_writes[=on|off], io_uring=on|off, ring_depth=N, idle_reply=on|off, readdirplus, no_readdirplus, attr_timeout=S, entry_timeout=S, \
                 negative_timeout=S, max_background=N, read_ahead=SIZE, cache_floor=auto|SIZE, threads=N, fault_injection, {}, log=FILE, \
                 log_level=error|warn|info|debug)",
                foliofs_object::MOUNT_OPTIONS
            ),
        }
    }
    if o.allow_other == Some(true) && o.allow_root {
        bail!("allow_other and allow_root exclude each other");
    }
    Ok(o)
}

/// A whole-number option within `range`.
fn number<T>(k: &str, v: &str, range: std::ops::RangeInclusive<T>) -> Result<T>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    v.parse()
        .ok()
        .filter(|n| range.contains(n))
        .with_context(|| format!("-o {k}={v}: want {} to {}", range.start(), range.end()))
}

/// A timeout option in seconds (fractions allowed, 0 for none).
fn seconds(k: &str, v: &str) -> Result<Duration> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && (0.0..=1e9).contains(s))
        .map(Duration::from_secs_f64)
        .with_context(|| format!("-o {k}={v}: want seconds, 0 or more"))
}

/// Whether this user may open /dev/fuse, checked before the image is
/// opened and its journal replayed. fusermount3 opens it with the caller's
/// own rights too, so where it is root's alone (mode 0600: no udev rule
/// made it 0666) only root can mount.
fn fuse_device_usable() -> Result<()> {
    let dev = c"/dev/fuse";
    // SAFETY: dev is NUL-terminated.
    if unsafe { libc::access(dev.as_ptr(), libc::R_OK | libc::W_OK) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EACCES) => bail!(
            "cannot open /dev/fuse: {e}: on this machine only root may mount FUSE \
             file systems (the device's mode is {:o}; fuse3's udev rule makes it 0666)",
            std::fs::metadata("/dev/fuse").map_or(0, |m| {
                use std::os::unix::fs::PermissionsExt;
                m.permissions().mode() & 0o7777
            })
        ),
        Some(libc::ENOENT) => {
            bail!("/dev/fuse does not exist: load the fuse module (modprobe fuse)")
        }
        _ => bail!("cannot open /dev/fuse: {e}"),
    }
}

/// statvfs(3) of `path`.
pub(crate) fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: p is NUL-terminated and st writable.
    match unsafe { libc::statvfs(p.as_ptr(), &mut st) } {
        0 => Ok(st),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `p` made absolute against the current directory (the daemon may run
/// elsewhere), without requiring it to exist.
fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("{}", p.display()))
}

/// Mount in this process and serve until unmounted. `ready` (a pipe) hears
/// "ok" once the mount is up, or the error that stopped it. The image is
/// owned (locked) from before the mount until this returns, after the
/// daemon's last write and close.
pub fn serve(image: &Path, dir: &Path, o: &Options, ready: Option<OwnedFd>) -> Result<()> {
    let mut ready = ready.map(std::fs::File::from);
    let dir = &dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let r = (|| -> Result<_> {
        fuse_device_usable()?;
        // statfs always reaches a FUSE daemon; stat may be answered from
        // attributes the kernel still holds for a dead mount's root.
        let meta = statvfs(dir)
            .and_then(|_| std::fs::metadata(dir))
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ENOTCONN) {
                    anyhow::anyhow!(
                        "mount point {}: a dead FUSE mount (its daemon exited without \
                         unmounting): unmount it first (umount or foliofs umount)",
                        dir.display()
                    )
                } else {
                    anyhow::Error::new(e).context(format!("mount point {}", dir.display()))
                }
            })?;
        if !meta.is_dir() {
            bail!("mount point {} is not a directory", dir.display());
        }
        // The mount's source names the image by its absolute path, so that
        // openers of the image find the mount (see `device::lock`); an
        // object image by its URL.
        let url = crate::object::url_of(image).map(str::to_string);
        let image = match &url {
            Some(u) => PathBuf::from(u),
            None => image
                .canonicalize()
                .with_context(|| format!("cannot open {}", image.display()))?,
        };
        // A block device mounted by root is a fuseblk mount: the kernel
        // claims the device itself (so the daemon does not open it O_EXCL)
        // and passes syncfs(2) and sync(1) on (FUSE_SYNCFS).
        // SAFETY: geteuid has no preconditions.
        let blkdev = url.is_none()
            && unsafe { libc::geteuid() } == 0
            && std::fs::metadata(&image)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()));
        let (dev, object): (Arc<dyn foliofs::device::Device>, _) = match &url {
            Some(u) => {
                let d = crate::object::open(u, o.engine.read_only, Some(dir), &o.object)?;
                let d = Arc::new(d);
                (d.clone(), Some(d))
            }
            None if !o.object_given.is_empty() => bail!(
                "-o {} is for object images (s3://BUCKET/PREFIX); {} is a file",
                o.object_given.join(","),
                image.display()
            ),
            None => {
                let d = FileDevice::open_with(
                    &image,
                    &DeviceOptions {
                        writable: !o.engine.read_only,
                        daemon: true,
                        exclusive: !blkdev,
                        ..Default::default()
                    },
                )
                .map_err(|e| crate::open_error(&image, e))?;
                (Arc::new(d), None)
            }
        };
        let (dev, faults): (Arc<dyn foliofs::device::Device>, _) = if o.fault_injection {
            let d = foliofs::device::FaultDevice::new(dev);
            let f = d.faults();
            log::warn!("fault injection on: root may make the device fail (foliofs.fault)");
            (Arc::new(d), Some(f))
        } else {
            (dev, None)
        };
        let fs = Arc::new(
            Fs::mount(dev, o.engine.clone())
                .with_context(|| format!("cannot mount {}", image.display()))?,
        );
        let mut cfg = Config::default();
        cfg.mount_options = vec![
            MountOption::FSName(image.display().to_string()),
            MountOption::Subtype("foliofs".into()),
            if o.engine.read_only {
                MountOption::RO
            } else {
                MountOption::RW
            },
        ];
        if o.default_permissions {
            cfg.mount_options.push(MountOption::DefaultPermissions);
        }
        // The kernel makes its own cached writes synchronous under `sync`
        // (an fsync after each); the engine does the rest.
        if o.engine.sync {
            cfg.mount_options.push(MountOption::Sync);
        }
        if o.engine.dirsync {
            cfg.mount_options.push(MountOption::DirSync);
        }
        if blkdev {
            cfg.mount_options.push(MountOption::BlockDevice);
        }
        if o.dev {
            cfg.mount_options.push(MountOption::Dev);
        }
        if o.suid {
            cfg.mount_options.push(MountOption::Suid);
        }
        if o.noexec {
            cfg.mount_options.push(MountOption::NoExec);
        }
        cfg.acl = if o.allow_other() {
            SessionACL::All
        } else if o.allow_root {
            SessionACL::RootAndOwner
        } else {
            SessionACL::Owner
        };
        cfg.clone_fd = true;
        let device_status = object.clone().map(|d| {
            Arc::new(move || serde_json::to_value(d.stats()).unwrap_or_default())
                as foliofs_fuse::DeviceStatus
        });
        let fuse = FuseOptions {
            cache: o.cache.clone(),
            posix_acl: o.default_permissions,
            io_uring: o.io_uring,
            faults,
            device_status,
        };
        let serve = Serve {
            threads: o.threads,
            ring_depth: o.ring_depth,
            idle_reply: o.idle_reply,
        };
        let session = Session::mount(fs.clone(), dir, cfg, fuse, serve)
            .with_context(|| format!("cannot mount on {}", dir.display()))?;
        // INIT is done (Session::mount waits for it): did the kernel agree?
        let uring = session.over_rings();
        log::info!(
            "mounted {} on {} ({}{}, over {})",
            image.display(),
            dir.display(),
            if o.engine.read_only { "ro" } else { "rw" },
            if o.allow_other() { ", allow_other" } else { "" },
            if uring {
                "FUSE over io_uring"
            } else {
                "/dev/fuse"
            }
        );
        Ok((fs, session, object))
    })();
    let (fs, mut session, object) = match r {
        Ok(v) => v,
        Err(e) => {
            log::error!("{e:#}");
            if let Some(p) = ready.as_mut() {
                let _ = writeln!(p, "{e:#}");
            }
            return Err(e);
        }
    };
    let mut unmounter = session.unmounter();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = unmounter.unmount();
        }
    });
    if let Some(mut p) = ready.take() {
        let _ = writeln!(p, "ok");
    }
    let served = session.serve();
    handle.close();
    let fs = match Arc::try_unwrap(fs) {
        Ok(fs) => fs,
        Err(_) => bail!("file system still referenced after the session ended"),
    };
    // Write everything back and mark the image clean; the image is closed
    // (and its lock released) when `fs` is dropped at the end of this.
    match fs.unmount() {
        Ok(()) => log::info!("unmounted {}: written back, clean", dir.display()),
        Err(e) => {
            log::error!("unmount of {} failed: {e}", dir.display());
            return Err(e).context("unmount");
        }
    }
    // An object image: the WAL folded into chunks and a manifest that
    // names no writer, so the next mount needs no takeover.
    if let Some(o) = object {
        o.close().context("closing the object image")?;
        log::info!("closed the object image: {:?}", o.stats());
    }
    served.context("FUSE session")?;
    Ok(())
}

/// How long `foliofs umount` waits for the daemon to finish.
pub const UMOUNT_WAIT: Duration = lock::DEFAULT_WAIT;

/// The `-o profile=NAME` the daemon serving `url` on `dir` was started
/// with, from its command line in /proc (`foliofs mount ... URL DIR -o
/// LIST`, or mount(8)'s `foliofs URL DIR -o LIST`). Not asked of the
/// daemon itself: a request to one that is stopped never returns, and
/// the mount stays busy while it waits.
fn daemon_profile(url: &str, dir: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if !args.contains(&url.as_bytes()) {
            continue;
        }
        // The mount point as given, relative to the daemon's directory
        // (read as a link: nothing on the mount is looked at).
        let cwd = std::fs::read_link(entry.path().join("cwd")).unwrap_or_default();
        let names_dir = args.iter().any(|a| {
            let given = cwd.join(std::ffi::OsStr::from_bytes(a));
            let clean: PathBuf = given.components().fold(PathBuf::new(), |mut p, c| {
                match c {
                    std::path::Component::ParentDir => drop(p.pop()),
                    std::path::Component::CurDir => {}
                    c => p.push(c),
                }
                p
            });
            clean == dir
        });
        if !names_dir {
            continue;
        }
        let mut it = args.iter();
        while let Some(&a) = it.next() {
            let list = if a == b"-o" {
                it.next().copied()
            } else {
                a.strip_prefix(b"-o")
            };
            let Some(list) = list.and_then(|l| std::str::from_utf8(l).ok()) else {
                continue;
            };
            // Read as the daemon read it.
            let mut given = foliofs_object::ObjectOptions::default();
            if given.take_from(list).is_ok() && given.profile.is_some() {
                return given.profile;
            }
        }
        return None;
    }
    None
}

/// `foliofs umount DIR`: unmount a foliofs mount and return once its daemon
/// has written everything, closed the image and left it clean. Ok(0) when
/// clean; an error (exit 32, as umount(8)) otherwise.
pub fn umount(dir: &Path) -> Result<i32> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("{}", dir.display()))?;
    let Some(m) = lock::fuse_mounts()
        .into_iter()
        .rev()
        .find(|m| m.mount_point == dir)
    else {
        bail!("{} is not a FUSE mount", dir.display());
    };
    if let Some(url) = crate::object::url_of(Path::new(&m.source)) {
        // The store as the daemon reached it: a mount from /etc/fstab
        // with -o profile=NAME, unmounted from a shell without AWS_PROFILE.
        let profile = daemon_profile(url, &dir);
        detach(&dir)?;
        if m.read_only || crate::object::wait_closed(url, profile.as_deref(), UMOUNT_WAIT)? {
            return Ok(0);
        }
        bail!(
            "{} was unmounted, but its daemon did not close {url} cleanly: the next \
             mount needs -o takeover and replays its WAL and journal (see the daemon's log)",
            dir.display()
        );
    }
    let image = PathBuf::from(&m.source);
    let holder = match lock::probe(&image) {
        Ok(Some(h)) if h.daemon => h.to_string(),
        // Its daemon is gone (killed): the kernel mount is left dead.
        Ok(h) if h.as_ref().is_none_or(|h| h.pid.is_none()) && foliofs_image(&image) => {
            detach(&dir)?;
            bail!(
                "{} was a dead mount: its daemon had exited without unmounting; \
                 unmounted it; the next mount (or fsck) of {} replays its journal",
                dir.display(),
                image.display()
            );
        }
        _ => bail!(
            "{} is not a foliofs mount (its source {} is not an image held by a foliofs daemon)",
            dir.display(),
            m.source
        ),
    };
    detach(&dir)?;
    // The image's lock is released after the daemon's last write and
    // close: owning it proves the daemon has finished.
    let dev = FileDevice::open_with(
        &image,
        &DeviceOptions {
            writable: false,
            wait: UMOUNT_WAIT,
            ..Default::default()
        },
    )
    .map_err(|e| crate::open_error(&image, e))?;
    let sb = foliofs::meta::read_superblock(&dev)
        .with_context(|| format!("reading {} after the unmount", image.display()))?;
    if m.read_only || sb.flags & foliofs::format::superblock::FLAG_CLEAN != 0 {
        return Ok(0);
    }
    bail!(
        "{} was unmounted, but its daemon ({holder}) did not finish cleanly: \
         {} needs journal replay (see the daemon's log; fsck or the next mount replays it)",
        dir.display(),
        image.display()
    )
}

/// Whether `path` holds a foliofs superblock (read without taking it).
fn foliofs_image(path: &Path) -> bool {
    FileDevice::open_with(
        path,
        &DeviceOptions {
            writable: false,
            lock: false,
            ..Default::default()
        },
    )
    .is_ok_and(|d| foliofs::meta::read_superblock(&d).is_ok())
}

/// Unmount DIR: umount2(2) as root, fusermount3 otherwise.
fn detach(dir: &Path) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
            bail!(
                "cannot unmount {}: {}",
                dir.display(),
                std::io::Error::last_os_error()
            );
        }
        return Ok(());
    }
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(dir)
        .status()
        .context("cannot run fusermount3 (Debian package fuse3)")?;
    if !st.success() {
        bail!("fusermount3 -u {} failed ({st})", dir.display());
    }
    Ok(())
}

/// Start `foliofs mount --foreground` in the background and wait until it
/// reports the mount up (or fails). Its messages go to `-o log=FILE`,
/// syslog, or a file of the mount's own; where, it says here, once.
pub fn spawn(image: &Path, dir: &Path, opts: &[String], o: &Options) -> Result<()> {
    match logging::daemon_sink(o.log_file.as_deref(), dir) {
        logging::Sink::DefaultFile(f) => match logging::writable(&f) {
            Ok(()) => eprintln!(
                "foliofs: no syslog here (/dev/log): the daemon of {} logs to {} \
                 (-o log=FILE to choose)",
                dir.display(),
                f.display()
            ),
            // The mount goes on: a log that cannot be written is no reason
            // to refuse it, but the operator hears that it is not kept.
            Err(e) => eprintln!(
                "foliofs: warning: no syslog here (/dev/log) and {e:#}: the daemon of {} \
                 keeps no log; use -o log=FILE",
                dir.display()
            ),
        },
        logging::Sink::Syslog => eprintln!(
            "foliofs: the daemon of {} logs to syslog (-o log=FILE to choose)",
            dir.display()
        ),
        _ => {}
    }
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here only.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let exe = std::env::current_exe().context("cannot find the foliofs executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("--foreground").arg(image).arg(dir);
    for o in opts {
        cmd.arg("-o").arg(o);
    }
    let wr_fd = wr.as_raw_fd();
    cmd.env("FOLIOFS_READY_FD", wr_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            // Keep the ready pipe open across exec.
            let fl = libc::fcntl(wr_fd, libc::F_GETFD);
            libc::fcntl(wr_fd, libc::F_SETFD, fl & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the mount process")?;
    drop(wr);
    let mut line = String::new();
    BufReader::new(std::fs::File::from(rd)).read_line(&mut line)?;
    match line.trim_end() {
        "ok" => Ok(()),
        "" => {
            let st = child.wait()?;
            bail!("the mount process exited ({st}) before mounting")
        }
        msg => {
            let _ = child.wait();
            bail!("{msg}")
        }
    }
}

/// The ready pipe handed down by `spawn`, if any.
pub fn ready_fd() -> Option<OwnedFd> {
    let fd: i32 = std::env::var("FOLIOFS_READY_FD").ok()?.parse().ok()?;
    std::env::remove_var("FOLIOFS_READY_FD");
    // SAFETY: the parent passed this descriptor for us to own.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `-o` asks to change a live mount (`mount -o remount,...`).
pub fn is_remount(options: &[String]) -> bool {
    options
        .iter()
        .flat_map(|s| s.split(','))
        .any(|o| o == "remount")
}

/// The options the kernel shows for a FUSE mount of its own accord
/// (user_id=0,group_id=0,...): mount(8) passes them back to the helper
/// at remount, from the mount table.
fn kernel_fuse_option(o: &str) -> bool {
    let key = o.split_once('=').map_or(o, |(k, _)| k);
    matches!(
        key,
        "user_id" | "group_id" | "rootmode" | "fd" | "max_read" | "blksize" | "fsname" | "subtype"
    )
}

/// `mount -o remount[,ro|rw][,nosuid|suid,...] DIR`: change a live
/// mount's flags, as mount(8) asks the helper to. The kernel's FUSE takes
/// read-only, sync and the per-mount flags at remount and nothing else;
/// of the engine's options, `sync` and `dirsync` follow (an ioctl to the
/// daemon), the rest (fixed while mounted) are checked and left as they
/// are. Going read-only, the kernel first writes its cached data back to
/// the daemon; then the daemon commits, so the image is as durable as
/// after `foliofs sync` and stays so (no writes reach it). An image the
/// daemon opened read-only answers writes EROFS even after `remount,rw`.
pub fn remount(dir: &Path, options: &[String]) -> Result<()> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .context("mount point path holds a NUL byte")?;
    let st = statvfs(dir).with_context(|| format!("cannot remount {}", dir.display()))?;
    // The flags the mount has now, then the ones asked for.
    const FLAGS: [(libc::c_ulong, libc::c_ulong, &str, &str); 8] = [
        (libc::ST_RDONLY, libc::MS_RDONLY, "ro", "rw"),
        (libc::ST_SYNCHRONOUS, libc::MS_SYNCHRONOUS, "sync", "async"),
        (libc::ST_NOSUID, libc::MS_NOSUID, "nosuid", "suid"),
        (libc::ST_NODEV, libc::MS_NODEV, "nodev", "dev"),
        (libc::ST_NOEXEC, libc::MS_NOEXEC, "noexec", "exec"),
        (libc::ST_NOATIME, libc::MS_NOATIME, "noatime", "atime"),
        (
            libc::ST_NODIRATIME,
            libc::MS_NODIRATIME,
            "nodiratime",
            "diratime",
        ),
        (
            libc::ST_RELATIME,
            libc::MS_RELATIME,
            "relatime",
            "norelatime",
        ),
    ];
    let mut flags: libc::c_ulong = 0;
    for (st_flag, ms, _, _) in FLAGS {
        if st.f_flag & st_flag != 0 {
            flags |= ms;
        }
    }
    // Sync is what the options say, as for mount(2) itself: mount(8)
    // passes the whole list back, with `sync` or without it for async.
    flags &= !libc::MS_SYNCHRONOUS;
    let mut rest = Vec::new();
    for o in options.iter().flat_map(|s| s.split(',')) {
        if let Some((_, ms, _, _)) = FLAGS.iter().find(|f| f.2 == o) {
            flags |= ms;
        } else if let Some((_, ms, _, _)) = FLAGS.iter().find(|f| f.3 == o) {
            flags &= !ms;
        } else if o != "remount" && !o.is_empty() && !kernel_fuse_option(o) {
            rest.push(o.to_string());
        }
    }
    // What else mount(8) passes along must at least be valid options.
    parse_options(&rest)?;
    // SAFETY: a valid path; no source, type or data for a remount.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        let why = match e.raw_os_error() {
            Some(libc::EBUSY) => " (a file is open for writing)".to_string(),
            _ => String::new(),
        };
        bail!("cannot remount {}: {e}{why}", dir.display());
    }
    let f = std::fs::File::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
    // The kernel's sync flag changed with the remount; the engine's
    // follow (dirsync is the engine's alone, and only turns on).
    let dirsync = rest.iter().any(|o| o == "dirsync");
    foliofs_fuse::set_sync_mode(
        &f,
        Some(flags & libc::MS_SYNCHRONOUS != 0),
        dirsync.then_some(true),
    )
    .with_context(|| {
        format!(
            "remounted, but the sync options of {} did not change",
            dir.display()
        )
    })?;
    if flags & libc::MS_RDONLY != 0 {
        foliofs_fuse::sync_mount(&f).with_context(|| {
            format!(
                "remounted read-only, but the sync of {} failed",
                dir.display()
            )
        })?;
    }
    Ok(())
}

/// The options of a mount that mount(8) asks the helper for. mount(8)
/// passes on `nodev` and `nosuid` but not `dev` and `suid`, the defaults
/// of kernel file systems; so, as libfuse's mount.fuse does, a helper run
/// by root takes `dev,suid` unless the options say otherwise (a user's
/// mount stays nodev,nosuid: fusermount3 allows nothing else).
pub fn helper_defaults(mut options: Vec<String>) -> Vec<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && !is_remount(&options) {
        options.insert(0, "dev,suid".into());
    }
    options
}

/// Arguments in the mount.fuse helper convention:
/// `mount.fuse.foliofs SOURCE DIR [-o OPTS] [-n] [-s] [-f] [-v]`.
pub fn helper_args(args: &[String]) -> Result<(PathBuf, PathBuf, Vec<String>, bool)> {
    let mut pos = Vec::new();
    let mut opts = Vec::new();
    let mut foreground = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-o" => {
                i += 1;
                opts.push(args.get(i).context("-o needs options")?.clone());
            }
            s if s.starts_with("-o") => opts.push(s[2..].to_string()),
            "-f" => foreground = true,
            "-n" | "-s" | "-v" => {}
            s if s.starts_with('-') => bail!("unknown helper flag {s}"),
            s => pos.push(PathBuf::from(s)),
        }
        i += 1;
    }
    match <[PathBuf; 2]>::try_from(pos) {
        Ok([src, dir]) => Ok((src, dir, opts, foreground)),
        Err(_) => bail!("usage: mount.fuse.foliofs IMAGE DIR [-o OPTIONS]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// umount finds a daemon's `-o profile=` on its command line, the
    /// mount point given relative to the daemon's directory, and only
    /// for the URL and directory it serves.
    #[test]
    fn the_daemons_profile_comes_from_its_command_line() {
        let tmp = std::env::temp_dir().join(format!("foliofs-profile-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("m")).unwrap();
        let url = format!("s3://b/p{}", std::process::id());
        // sh -c takes the words after its script as $0, $1, ...: they
        // stand in its command line as a daemon's would.
        let mut daemon = Command::new("sh")
            .args([
                "-c",
                "sleep 30",
                "mount",
                &url,
                "./x/../m",
                "-o",
                "rw,profile=backup",
            ])
            .current_dir(&tmp)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let found = daemon_profile(&url, &tmp.join("m"));
        let other_dir = daemon_profile(&url, &tmp.join("n"));
        let other_url = daemon_profile("s3://b/elsewhere", &tmp.join("m"));
        let _ = daemon.kill();
        let _ = daemon.wait();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(found.as_deref(), Some("backup"));
        assert_eq!(other_dir, None);
        assert_eq!(other_url, None);
    }

    #[test]
    fn options() {
        let o = parse_options(&["ro,allow_other,dio_cap=1,dirty_limit=8M,noauto".into()]).unwrap();
        let w = parse_options(&["wb_contexts=2,page_cache=64M,prealloc=off".into()]).unwrap();
        // cache_size: the metadata cache of an image file, the cache
        // directory of an object image.
        let list = ["cache_dir=/var/cache/x,cache_size=20G".to_string()];
        let file = parse_options(&list).unwrap();
        assert_eq!(file.engine.meta_cache_bytes, 20 << 30);
        let mut object = parse_options(&list).unwrap();
        object.object_image();
        assert_eq!(object.object.cache_size, 20 << 30);
        assert_eq!(
            object.engine.meta_cache_bytes,
            MountOptions::default().meta_cache_bytes
        );
        assert_eq!(w.engine.writeback_contexts, 2);
        assert_eq!(w.engine.cache_bytes, 64 << 20);
        assert!(w.engine.no_prealloc);
        assert!(w.engine.drop_behind, "the mount drops behind by default");
        let d = parse_options(&["drop_behind=off".into()]).unwrap();
        assert!(!d.engine.drop_behind);
        assert!(
            !w.cache.direct_writes,
            "writers go through the kernel's cache"
        );
        for (opt, on) in [("direct_writes", true), ("direct_writes=off", false)] {
            assert_eq!(
                parse_options(&[opt.into()]).unwrap().cache.direct_writes,
                on
            );
        }
        assert!(parse_options(&["direct_writes=2".into()]).is_err());
        assert!(
            w.engine.direct_read_ahead,
            "the mount reads direct streams ahead"
        );
        let a = parse_options(&["dio_ahead=off".into()]).unwrap();
        assert!(!a.engine.direct_read_ahead);
        assert!(parse_options(&["dio_ahead=2".into()]).is_err());
        assert!(parse_options(&["wb_contexts=0".into()]).is_err());
        assert!(o.engine.read_only && o.allow_other() && o.default_permissions);
        let n = parse_options(&["noallow_other,noatime,log_level=debug".into()]).unwrap();
        assert!(!n.allow_other(), "noallow_other turns it off, root or not");
        assert_eq!(n.engine.atime, foliofs::fs::Atime::Noatime);
        assert_eq!(o.engine.dio_max_blocks, 1);
        assert_eq!(o.engine.dirty_limit_bytes, 8 << 20);
        assert!(parse_options(&["bogus".into()]).is_err());
        assert!(parse_options(&["dio_cap=0".into()]).is_err());
        assert!(parse_options(&["allow_other,allow_root".into()]).is_err());
        let o = parse_options(&["no_default_permissions,dio_lock=exclusive".into()]).unwrap();
        assert!(!o.default_permissions);
        assert_eq!(o.engine.dio_lock, foliofs::DioLock::Exclusive);
        assert_eq!(o.cache.read_ahead, foliofs_fuse::DEFAULT_READ_AHEAD);
        let r = parse_options(&["read_ahead=2M".into()]).unwrap();
        assert_eq!(r.cache.read_ahead, 2 << 20);
        assert_eq!(
            parse_options(&["read_ahead=0".into()])
                .unwrap()
                .cache
                .read_ahead,
            0
        );
        assert!(parse_options(&["read_ahead=2G".into()]).is_err());
        assert!(parse_options(&["read_ahead=lots".into()]).is_err());
    }

    #[test]
    fn helper() {
        let a: Vec<String> = ["img", "/mnt", "-o", "rw,noauto", "-n"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (s, d, o, f) = helper_args(&a).unwrap();
        assert_eq!(
            (s, d, o, f),
            ("img".into(), "/mnt".into(), vec!["rw,noauto".into()], false)
        );
        assert!(helper_args(&a[..1]).is_err());
    }
}

//! One owner per image.
//!
//! Whatever opens an image (a mount daemon, fsck, mkfs, bench, a program
//! using the library) takes an exclusive flock(2) on it for as long as it
//! holds it open; block devices are also opened O_EXCL, which keeps kernel
//! mounts out. The lock belongs to the open file, so the kernel releases
//! it when the owner closes the image after its last write, or dies.
//!
//! A second opener must tell a busy image from one whose owner is only
//! finishing. umount(8) of a FUSE mount returns as soon as the kernel has
//! detached it; the daemon then writes back its dirty data, checkpoints and
//! marks the image clean. `umount DIR; mount IMAGE DIR` must wait for that
//! rather than fail or read a half-written image. So a mount daemon also
//! holds an OFD lock on byte 0 of the image (the daemon mark), and an
//! opener that finds the image locked decides:
//!
//! - the image is mounted (a FUSE mount in /proc/self/mountinfo whose
//!   source is this image): fail at once, naming the mount point;
//! - a daemon holds it and its mount is gone: wait, up to a bound, for it
//!   to finish (the daemon mark says which holder is a daemon);
//! - anything else (fsck, mkfs, bench, a program): fail at once.
//!
//! flock and OFD locks are independent on Linux and neither keeps anyone
//! from reading or writing: they only speak to openers who ask.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long an opener waits for a daemon that is finishing after its
/// unmount, unless told otherwise: a daemon writes back at most its dirty
/// limit (768 MiB by default) and checkpoints, seconds on any disk.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(120);

/// How long an unmarked, unmounted holder is given to finish arriving or
/// leaving before it counts as busy.
const SETTLE: Duration = Duration::from_millis(300);

/// Who holds an image, as far as can be known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub pid: Option<u32>,
    /// The holder's command line, if readable.
    pub command: Option<String>,
    /// Where the image is mounted, if it is.
    pub mount_point: Option<PathBuf>,
    /// The holder carries the daemon mark (it is a mount daemon).
    pub daemon: bool,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.command, self.pid) {
            (Some(c), Some(p)) => write!(f, "pid {p} ({c})")?,
            (None, Some(p)) => write!(f, "pid {p}")?,
            _ => write!(f, "another program")?,
        }
        if let Some(m) = &self.mount_point {
            write!(f, " mounted on {}", m.display())?;
        }
        Ok(())
    }
}

/// Try to become the image's owner. Ok(false): someone else is.
pub(crate) fn try_own(file: &File) -> io::Result<bool> {
    // SAFETY: flock on a descriptor we own; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(e),
    }
}

fn ofd(file: &File, cmd: libc::c_int, kind: libc::c_short) -> io::Result<libc::flock> {
    // SAFETY: a zeroed flock is valid; the fields set below describe byte 0.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    // SAFETY: fcntl with an OFD lock command reads and writes `fl` only.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl)
}

/// Carry the daemon mark (see the module comment), or drop it.
pub(crate) fn mark_daemon(file: &File, on: bool) -> io::Result<()> {
    // A read lock: a read-only mount's descriptor may take it, and a
    // write-lock probe from any other descriptor still sees it.
    let kind = if on { libc::F_RDLCK } else { libc::F_UNLCK };
    ofd(file, libc::F_OFD_SETLK, kind as libc::c_short).map(|_| ())
}

fn is_daemon_marked(file: &File) -> bool {
    ofd(file, libc::F_OFD_GETLK, libc::F_WRLCK as libc::c_short)
        .is_ok_and(|fl| fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// Who holds the lock on `file` (the image at `path`), or None if nobody.
pub fn holder(file: &File, path: &Path) -> io::Result<Option<Holder>> {
    let meta = file.metadata()?;
    let pid = flock_holder(meta.dev(), meta.ino());
    let daemon = is_daemon_marked(file);
    let mount_point = mounted_on(&meta);
    if pid.is_none() && !daemon && mount_point.is_none() {
        // Nobody shows in the tables: free unless the lock says otherwise.
        let probe = File::open(path).or_else(|_| file.try_clone())?;
        if try_own(&probe)? {
            return Ok(None);
        }
    }
    Ok(Some(Holder {
        pid,
        command: pid.and_then(command_line),
        mount_point,
        daemon,
    }))
}

/// The pid that holds a flock on (dev, ino), from /proc/locks.
fn flock_holder(dev: u64, ino: u64) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        libc::major(dev as libc::dev_t),
        libc::minor(dev as libc::dev_t)
    );
    locks.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5358142 0 EOF"
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 6 && f[1] == "FLOCK" && f[5] == want)
            .then(|| f[4].parse().ok())
            .flatten()
    })
}

fn command_line(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if args.is_empty() {
        return None;
    }
    let mut s = args.join(" ");
    if s.len() > 160 {
        let mut cut = 157;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    Some(s)
}

/// Undo mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |v, c| v * 8 + (c - b'0') as u32);
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One FUSE mount from /proc/self/mountinfo.
#[derive(Clone, Debug)]
pub struct FuseMount {
    pub mount_point: PathBuf,
    pub source: String,
    pub fstype: String,
    pub read_only: bool,
}

/// The FUSE mounts visible to this process.
pub fn fuse_mounts() -> Vec<FuseMount> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            // id parent maj:min root point options [optional...] - type source super
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let fstype = *post.first()?;
            // fuse, fuseblk, or either with a subtype ("fuse.foliofs").
            let base = fstype.split_once('.').map_or(fstype, |(t, _)| t);
            if base != "fuse" && base != "fuseblk" {
                return None;
            }
            Some(FuseMount {
                mount_point: PathBuf::from(unescape(pre.get(4)?)),
                source: unescape(post.get(1)?),
                fstype: fstype.to_string(),
                read_only: pre.get(5)?.split(',').any(|o| o == "ro"),
            })
        })
        .collect()
}

/// Where the image with this metadata is FUSE-mounted, if it is: a mount
/// whose source names the same file.
fn mounted_on(meta: &std::fs::Metadata) -> Option<PathBuf> {
    fuse_mounts().into_iter().find_map(|m| {
        let s = std::fs::metadata(&m.source).ok()?;
        (s.dev() == meta.dev() && s.ino() == meta.ino()).then_some(m.mount_point)
    })
}

/// What an opener should do about a locked image.
enum Verdict {
    Busy(Holder),
    Wait(Holder),
}

fn judge(file: &File, path: &Path) -> io::Result<Option<Verdict>> {
    Ok(holder(file, path)?.map(|h| {
        if h.daemon && h.mount_point.is_none() {
            Verdict::Wait(h)
        } else {
            Verdict::Busy(h)
        }
    }))
}

fn busy(path: &Path, h: &Holder) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!("{} is in use by {h}", path.display()),
    )
}

/// Become the owner of the image at `path`, waiting up to `wait` for a
/// daemon that is finishing after its unmount. Fails at once, with
/// `ResourceBusy` naming the holder, when the image is mounted or held by
/// anything else. `open_owned` opens the image and takes the lock (None:
/// someone else has it); `open_plain` opens it just to look at its lock.
pub(crate) fn acquire(
    path: &Path,
    wait: Duration,
    open_owned: impl FnMut() -> io::Result<Option<File>>,
    open_plain: impl FnMut() -> io::Result<File>,
) -> io::Result<File> {
    acquire_settling(path, wait, SETTLE, open_owned, open_plain)
}

/// `acquire`, with `settle` for how long an owner with no mark may look
/// busy before it is (tests choose it: the order of the looks is theirs
/// then, not the clock's).
fn acquire_settling(
    path: &Path,
    wait: Duration,
    settle: Duration,
    mut open_owned: impl FnMut() -> io::Result<Option<File>>,
    mut open_plain: impl FnMut() -> io::Result<File>,
) -> io::Result<File> {
    let started = Instant::now();
    // Since when the holder has looked unmarked (or absent) without a
    // break: a daemon that exits drops its mark a moment before its
    // flock, so after a long wait for it that moment must not count as
    // the whole settle time.
    let mut unmarked: Option<Instant> = None;
    let mut said = false;
    loop {
        if let Some(f) = open_owned()? {
            if said {
                log::warn!("{}: its previous owner has finished", path.display());
            }
            return Ok(f);
        }
        let verdict = judge(&open_plain()?, path)?;
        let settled = match verdict {
            Some(Verdict::Wait(_)) => {
                unmarked = None;
                false
            }
            _ => unmarked.get_or_insert_with(Instant::now).elapsed() >= settle,
        };
        match verdict {
            Some(Verdict::Busy(h)) if h.mount_point.is_some() => return Err(busy(path, &h)),
            // Held by an owner with neither mount nor daemon mark, or by
            // nobody we can see (a kernel mount, an O_EXCL opener of a
            // block device): an owner arriving or leaving (a process that
            // exits drops its daemon mark before its flock) looks like
            // this for a moment. Look again until SETTLE, then it is busy.
            Some(Verdict::Busy(h)) if settled => return Err(busy(path, &h)),
            None if settled => {
                // Free when looked at: its owner may have closed it just
                // after `open_owned` found it taken (a daemon finishing
                // after `umount`). One more try tells that from a holder
                // no table shows (a kernel mount, an O_EXCL opener).
                if let Some(f) = open_owned()? {
                    return Ok(f);
                }
                return Err(busy(path, &Holder::default()));
            }
            Some(Verdict::Busy(_)) | None => {}
            Some(Verdict::Wait(h)) => {
                if started.elapsed() >= wait {
                    return Err(io::Error::new(
                        io::ErrorKind::ResourceBusy,
                        format!(
                            "{} is still in use by {h}, which has not finished writing \
                             after its unmount ({} s)",
                            path.display(),
                            wait.as_secs()
                        ),
                    ));
                }
                // A daemon usually finishes within milliseconds: say so
                // only when the wait is long enough to notice.
                if !said && started.elapsed() >= Duration::from_secs(1) {
                    log::warn!(
                        "{}: waiting for {h} to finish writing it after its unmount",
                        path.display()
                    );
                    said = true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Who holds the image at `path`, without taking it (for read-only
/// inspection of a mounted image).
pub fn probe(path: &Path) -> io::Result<Option<Holder>> {
    let f = File::open(path)?;
    holder(&f, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("plain"), "plain");
        assert_eq!(unescape("tail\\04"), "tail\\04");
    }

    fn own(p: &Path) -> io::Result<Option<File>> {
        let f = File::open(p)?;
        Ok(try_own(&f)?.then_some(f))
    }

    /// A fresh 4 KiB image in its own temporary directory: (dir, image).
    fn temp_image(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("foliofs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("img");
        std::fs::write(&p, [0u8; 4096]).unwrap();
        (dir, p)
    }

    /// An owner that closes the image after the opener found it taken and
    /// before it looked at who holds it, past the settle time (a daemon
    /// finishing as `mount` follows `umount`): the opener gets the image.
    /// The settle time is zero, so the first look is already past it and
    /// the owner closes between that look and the next, every time.
    #[test]
    fn an_owner_closing_between_the_two_looks_is_not_a_busy_image() {
        let (dir, p) = temp_image("lock-race");
        let mut owner = own(&p).unwrap();
        assert!(owner.is_some());
        let got = acquire_settling(
            &p,
            Duration::from_secs(5),
            Duration::ZERO,
            || own(&p),
            || {
                owner.take();
                File::open(&p)
            },
        );
        assert!(got.is_ok(), "{got:?}");
        drop(got);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_owner_is_refused_and_the_first_close_frees_the_image() {
        let (dir, p) = temp_image("lock");
        let a = File::options().read(true).write(true).open(&p).unwrap();
        assert!(try_own(&a).unwrap());
        let b = File::open(&p).unwrap();
        assert!(!try_own(&b).unwrap());
        let h = holder(&b, &p).unwrap().expect("held");
        assert_eq!(h.pid, Some(std::process::id()));
        assert!(!h.daemon && h.mount_point.is_none());
        // Not a daemon: a second opener fails (after the settle time),
        // naming the holder.
        let t = Instant::now();
        let e = acquire(&p, Duration::from_secs(5), || own(&p), || File::open(&p)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
        assert!(
            e.to_string()
                .contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(1));
        // A daemon whose mount is gone: the opener waits until it closes.
        mark_daemon(&a, true).unwrap();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(a);
        });
        let t = Instant::now();
        let got = acquire(&p, Duration::from_secs(10), || own(&p), || File::open(&p));
        assert!(got.is_ok(), "{got:?}");
        assert!(t.elapsed() >= Duration::from_millis(250));
        closer.join().unwrap();
        drop(got);
        assert!(probe(&p).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A daemon that exits drops its mark a moment before its flock. After
    /// a wait longer than the settle time, that moment is not a busy
    /// image: here the mark goes at 400 ms and the flock 50 ms later
    /// (CI once caught the moment inside a close).
    #[test]
    fn a_daemon_dropping_its_mark_before_its_lock_is_waited_for() {
        let (dir, p) = temp_image("lock-mark");
        let a = File::options().read(true).write(true).open(&p).unwrap();
        assert!(try_own(&a).unwrap());
        mark_daemon(&a, true).unwrap();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(400));
            mark_daemon(&a, false).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            drop(a);
        });
        let got = acquire(&p, Duration::from_secs(10), || own(&p), || File::open(&p));
        assert!(got.is_ok(), "{got:?}");
        closer.join().unwrap();
        drop(got);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

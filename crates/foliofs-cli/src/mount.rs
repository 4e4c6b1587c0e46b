//! `foliofs mount IMAGE DIR [-o OPTIONS] [-f]`, and the same as the
//! `mount.fuse.foliofs` helper that mount(8) and /etc/fstab call.
//!
//! Without -f the command starts a copy of itself in the background
//! (`--foreground`, its own session) and returns once that copy has
//! mounted, or prints why it could not. The mounted process unmounts
//! cleanly on SIGTERM, SIGINT or SIGHUP, and when the mount point is
//! unmounted from outside, writing everything back first.

use anyhow::{bail, Context, Result};
use foliofs::fs::ENGINE_OPTIONS;
use foliofs::{Fs, MountOptions};
use foliofs_fuse::FuseFs;
use fuser::{Config, MountOption, SessionACL};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

/// Parsed `-o` options.
#[derive(Debug, Clone)]
pub struct Options {
    pub engine: MountOptions,
    pub allow_other: bool,
    pub allow_root: bool,
    pub default_permissions: bool,
    pub threads: usize,
    /// The kernel's FUSE writeback cache (`-o writeback_cache`).
    pub writeback_cache: bool,
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
    "relatime",
    "norelatime",
    "strictatime",
    "noatime",
    "atime",
    "nodiratime",
    "lazytime",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "async",
    "silent",
    "loud",
];

pub fn parse_options(list: &[String]) -> Result<Options> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get() * 2)
        .unwrap_or(4)
        .clamp(2, 16);
    let mut o = Options {
        engine: MountOptions::default(),
        allow_other: false,
        allow_root: false,
        default_permissions: true,
        threads,
        writeback_cache: false,
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
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => bail!("-o {e}"),
        }
        match (k, v) {
            ("allow_other", None) => o.allow_other = true,
            ("allow_root", None) => o.allow_root = true,
            ("default_permissions", None) => o.default_permissions = true,
            ("no_default_permissions", None) => o.default_permissions = false,
            ("writeback_cache", None) => o.writeback_cache = true,
            ("no_writeback_cache", None) => o.writeback_cache = false,
            ("threads", Some(v)) => {
                o.threads = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=256).contains(n))
                    .with_context(|| format!("-o threads={v}: want 1 to 256"))?
            }
            (k, None) if IGNORED.contains(&k) => {}
            (k, _) if k.starts_with("x-") || k == "comment" || k == "fsname" || k == "subtype" => {}
            _ => bail!(
                "unknown mount option '{opt}' (known: {ENGINE_OPTIONS}, allow_other, \
                 allow_root, default_permissions, no_default_permissions, writeback_cache, \
                 no_writeback_cache, threads=N)"
            ),
        }
    }
    if o.allow_other && o.allow_root {
        bail!("allow_other and allow_root exclude each other");
    }
    Ok(o)
}

/// Mount in this process and serve until unmounted. `ready` (a pipe) hears
/// "ok" once the mount is up, or the error that stopped it.
pub fn serve(image: &Path, dir: &Path, o: &Options, ready: Option<OwnedFd>) -> Result<()> {
    let mut ready = ready.map(std::fs::File::from);
    let r = (|| -> Result<_> {
        let meta =
            std::fs::metadata(dir).with_context(|| format!("mount point {}", dir.display()))?;
        if !meta.is_dir() {
            bail!("mount point {} is not a directory", dir.display());
        }
        let dev = crate::open(image, !o.engine.read_only)?;
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
        cfg.acl = if o.allow_other {
            SessionACL::All
        } else if o.allow_root {
            SessionACL::RootAndOwner
        } else {
            SessionACL::Owner
        };
        cfg.n_threads = Some(o.threads);
        cfg.clone_fd = true;
        let session = fuser::Session::new(
            FuseFs::new(fs.clone()).with_writeback_cache(o.writeback_cache),
            dir,
            &cfg,
        )
        .with_context(|| format!("cannot mount on {}", dir.display()))?;
        Ok((fs, session))
    })();
    let (fs, mut session) = match r {
        Ok(v) => v,
        Err(e) => {
            if let Some(p) = ready.as_mut() {
                let _ = writeln!(p, "{e:#}");
            }
            return Err(e);
        }
    };
    let mut unmounter = session.unmount_callable();
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
    let served = session.run();
    handle.close();
    let fs = match Arc::try_unwrap(fs) {
        Ok(fs) => fs,
        Err(_) => bail!("file system still referenced after the session ended"),
    };
    fs.unmount().context("unmount")?;
    served.context("FUSE session")?;
    Ok(())
}

/// Start `foliofs mount --foreground` in the background and wait until it
/// reports the mount up (or fails).
pub fn spawn(image: &Path, dir: &Path, opts: &[String]) -> Result<()> {
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

    #[test]
    fn options() {
        let o = parse_options(&["ro,allow_other,dio_cap=1,dirty_limit=8M,noauto".into()]).unwrap();
        let w = parse_options(&["wb_contexts=2,page_cache=64M,prealloc=off".into()]).unwrap();
        assert_eq!(w.engine.writeback_contexts, 2);
        assert_eq!(w.engine.cache_bytes, 64 << 20);
        assert!(w.engine.no_prealloc);
        assert!(parse_options(&["wb_contexts=0".into()]).is_err());
        assert!(o.engine.read_only && o.allow_other && o.default_permissions);
        assert_eq!(o.engine.dio_max_blocks, 1);
        assert_eq!(o.engine.dirty_limit_bytes, 8 << 20);
        assert!(parse_options(&["bogus".into()]).is_err());
        assert!(parse_options(&["dio_cap=0".into()]).is_err());
        assert!(parse_options(&["allow_other,allow_root".into()]).is_err());
        let o = parse_options(&["no_default_permissions,dio_lock=exclusive".into()]).unwrap();
        assert!(!o.default_permissions);
        assert_eq!(o.engine.dio_lock, foliofs::DioLock::Exclusive);
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

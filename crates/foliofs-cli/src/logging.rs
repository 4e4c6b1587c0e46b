//! Where messages go. The engine and the FUSE adapter log through the `log`
//! crate (checksum failures with inode, offset and device address, device
//! I/O errors, shutdowns, journal replay); this module installs the sink:
//!
//! - commands (mkfs, fsck, ...): warnings and errors on stderr;
//! - a mount daemon in the foreground (`-f`): stderr;
//! - a daemonized mount: syslog where a socket takes messages (journald
//!   listens on /dev/log too); on a machine with neither, a file per mount
//!   (`default_log_file`), so that a checksum failure or a shutdown is
//!   never dropped without a trace;
//! - `-o log=FILE`: that file, appended to, one timestamped line each.
//!
//! `-o log_level=error|warn|info|debug` sets the level (default info).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    Stderr,
    Syslog,
    /// `-o log=FILE`: the operator's own file, appended to without bound
    /// (it may be rotated by logrotate, which a rename here would upset).
    File(PathBuf),
    /// The default file of a mount without syslog: bounded, rotated once.
    DefaultFile(PathBuf),
}

/// Where the default log file of a mount starts over: at this size it is
/// renamed to `NAME.1` (replacing an older one), so a mount's messages
/// take at most twice this on disk.
pub const DEFAULT_LOG_LIMIT: u64 = 8 << 20;

/// Where a daemonized mount logs when told nothing (`-o log=FILE` wins
/// over this): syslog when a socket takes messages, otherwise a file of
/// its own named after the mount point.
pub fn daemon_sink(log_file: Option<&Path>, mount_point: &Path) -> Sink {
    match log_file {
        Some(f) => Sink::File(f.to_path_buf()),
        None if syslog_available() => Sink::Syslog,
        None => default_sink(mount_point),
    }
}

/// The mount's own bounded log file, where syslog is not to be had.
pub fn default_sink(mount_point: &Path) -> Sink {
    Sink::DefaultFile(default_log_file(mount_point, is_root(), &state_dir()))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The user's state directory for foliofs (XDG base directories:
/// $XDG_STATE_HOME, or ~/.local/state).
fn state_dir() -> PathBuf {
    match std::env::var_os("XDG_STATE_HOME").filter(|v| Path::new(v).is_absolute()) {
        Some(d) => PathBuf::from(d).join("foliofs"),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/".into()))
            .join(".local/state/foliofs"),
    }
}

/// `/var/log/foliofs/NAME.log` for root, `STATE/NAME.log` otherwise, NAME
/// being the absolute mount point with its slashes turned into dashes
/// (`/srv/data` -> `srv-data`; `/` -> `root`), so that each mount point
/// has its own file.
pub fn default_log_file(mount_point: &Path, root: bool, state: &Path) -> PathBuf {
    let abs = std::path::absolute(mount_point).unwrap_or_else(|_| mount_point.to_path_buf());
    let name: String = abs
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| if c == '/' { '-' } else { c })
        .collect();
    let name = if name.is_empty() { "root".into() } else { name };
    let dir = if root {
        PathBuf::from("/var/log/foliofs")
    } else {
        state.to_path_buf()
    };
    dir.join(format!("{name}.log"))
}

pub fn parse_level(s: &str) -> Result<log::LevelFilter> {
    Ok(match s {
        "error" => log::LevelFilter::Error,
        "warn" | "warning" => log::LevelFilter::Warn,
        "info" => log::LevelFilter::Info,
        "debug" => log::LevelFilter::Debug,
        "trace" => log::LevelFilter::Trace,
        "off" => log::LevelFilter::Off,
        _ => bail!("log_level={s}: want error, warn, info, debug, trace or off"),
    })
}

/// Whether a syslog socket takes messages here.
pub fn syslog_available() -> bool {
    syslog::unix(formatter()).is_ok()
}

fn formatter() -> syslog::Formatter3164 {
    syslog::Formatter3164 {
        facility: syslog::Facility::LOG_DAEMON,
        hostname: None,
        process: "foliofs".into(),
        pid: std::process::id(),
    }
}

/// Install the logger. Call once, first thing.
pub fn init(sink: &Sink, level: log::LevelFilter) -> Result<()> {
    let base = fern::Dispatch::new()
        .level(level)
        // fuser's own per-request chatter stays out below warnings.
        .level_for("fuser", level.min(log::LevelFilter::Error));
    let d = match sink {
        Sink::Stderr => base
            .format(|out, msg, rec| {
                out.finish(format_args!(
                    "foliofs: {}{msg}",
                    match rec.level() {
                        log::Level::Error => "error: ",
                        log::Level::Warn => "warning: ",
                        _ => "",
                    }
                ))
            })
            .chain(std::io::stderr()),
        Sink::File(path) => base.format(file_line).chain(open_log(path)?),
        Sink::DefaultFile(path) => {
            let out: Box<dyn std::io::Write + Send> =
                Box::new(Bounded::open(path.clone(), DEFAULT_LOG_LIMIT)?);
            base.format(file_line).chain(out)
        }
        Sink::Syslog => base.chain(
            syslog::unix(formatter())
                .map_err(|e| anyhow::anyhow!("cannot reach syslog (/dev/log): {e}"))?,
        ),
    };
    d.apply().context("installing the logger")?;
    Ok(())
}

/// Whether the default log file can be written (its directory made, the
/// file opened for appending): the mount command checks before it says
/// where the daemon's messages go.
pub fn writable(path: &Path) -> Result<()> {
    Bounded::open(path.to_path_buf(), DEFAULT_LOG_LIMIT).map(|_| ())
}

/// One line of a log file: time, process, level, message.
fn file_line(out: fern::FormatCallback, msg: &std::fmt::Arguments, rec: &log::Record) {
    out.finish(format_args!(
        "{} foliofs[{}] {}: {msg}",
        humantime::format_rfc3339_millis(std::time::SystemTime::now()),
        std::process::id(),
        rec.level().as_str().to_ascii_lowercase(),
    ))
}

/// A log file that starts over when it reaches `limit` bytes, the full
/// one kept as `NAME.1` (one generation: enough to see what led up to a
/// failure, and the disk use stays bounded at twice the limit).
struct Bounded {
    path: PathBuf,
    file: std::fs::File,
    len: u64,
    limit: u64,
}

impl Bounded {
    fn open(path: PathBuf, limit: u64) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot make the log directory {}", dir.display()))?;
        }
        let file = open_log(&path)?;
        let len = file.metadata().map_or(0, |m| m.len());
        Ok(Bounded {
            path,
            file,
            len,
            limit,
        })
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, old)?;
        self.file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.len = 0;
        Ok(())
    }
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.len > 0 && self.len + buf.len() as u64 > self.limit {
            // Keep logging to the full file rather than lose the line if
            // the rename fails (a read-only directory, say).
            let _ = self.rotate();
        }
        let n = self.file.write(buf)?;
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

fn open_log(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open log file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        assert_eq!(parse_level("warn").unwrap(), log::LevelFilter::Warn);
        assert_eq!(parse_level("debug").unwrap(), log::LevelFilter::Debug);
        assert!(parse_level("loud").is_err());
    }

    #[test]
    fn default_file_is_named_after_the_mount_point() {
        let state = Path::new("/home/u/.local/state/foliofs");
        assert_eq!(
            default_log_file(Path::new("/srv/data"), true, state),
            Path::new("/var/log/foliofs/srv-data.log")
        );
        assert_eq!(
            default_log_file(Path::new("/srv/data/"), false, state),
            state.join("srv-data.log")
        );
        assert_eq!(
            default_log_file(Path::new("/"), true, state),
            Path::new("/var/log/foliofs/root.log")
        );
    }

    #[test]
    fn bounded_file_rotates_once_at_its_limit() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("foliofs-log-{}", std::process::id()));
        let path = dir.join("m.log");
        let mut b = Bounded::open(path.clone(), 100).unwrap();
        for i in 0..25 {
            writeln!(b, "line {i:02}").unwrap(); // 8 bytes each
        }
        let cur = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(dir.join("m.log.1")).unwrap();
        // 12 lines (96 bytes) fit; the 13th starts a new file, twice.
        assert!(cur.len() <= 100 && old.len() <= 100, "{cur:?} {old:?}");
        assert!(cur.ends_with("line 24\n"), "{cur:?}");
        assert!(old.starts_with("line 12\n"), "{old:?}");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            2,
            "one old generation"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}

//! Where messages go. The engine and the FUSE adapter log through the `log`
//! crate (checksum failures with inode, offset and device address, device
//! I/O errors, shutdowns, journal replay); this module installs the sink:
//!
//! - commands (mkfs, fsck, ...): warnings and errors on stderr;
//! - a mount daemon in the foreground (`-f`): stderr;
//! - a daemonized mount: syslog (journald listens on /dev/log too);
//! - `-o log=FILE`: that file, appended to, one timestamped line each.
//!
//! `-o log_level=error|warn|info|debug` sets the level (default info).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    Stderr,
    Syslog,
    File(PathBuf),
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
        Sink::File(path) => base
            .format(|out, msg, rec| {
                out.finish(format_args!(
                    "{} foliofs[{}] {}: {msg}",
                    humantime::format_rfc3339_millis(std::time::SystemTime::now()),
                    std::process::id(),
                    rec.level().as_str().to_ascii_lowercase(),
                ))
            })
            .chain(open_log(path)?),
        Sink::Syslog => base.chain(
            syslog::unix(formatter())
                .map_err(|e| anyhow::anyhow!("cannot reach syslog (/dev/log): {e}"))?,
        ),
    };
    d.apply().context("installing the logger")?;
    Ok(())
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
}

//! `foliofs stat --mount DIR`: a mounted foliofs's counters, as a page a
//! person reads (grouped, in units, with rates), as JSON for programs
//! (`--json`), or refreshed every few seconds (`--watch`), as vmstat does.
//!
//! The counters come from the daemon through a virtual xattr of the
//! mount's root (`foliofs_fuse::COUNTERS_XATTR`); space comes from
//! statvfs(2) of the mount, as df(1) has it.

use anyhow::{bail, Result};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// The counters of the foliofs mounted on `dir`.
pub fn read_counters(dir: &Path) -> Result<Value> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let name = std::ffi::CString::new(foliofs_fuse::COUNTERS_XATTR)?;
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: both strings are NUL-terminated; buf is writable for its length.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        bail!(
            "{} is not a foliofs mount root: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(serde_json::from_slice(&buf[..n as usize])?)
}

/// Space and inodes of the mount, from statvfs(2).
#[derive(Clone, Copy, Default)]
pub struct Space {
    pub bytes: u64,
    pub free_bytes: u64,
    pub inodes: u64,
    pub free_inodes: u64,
}

fn space(dir: &Path) -> Option<Space> {
    let p = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: p is NUL-terminated and st writable.
    if unsafe { libc::statvfs(p.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let f = st.f_frsize as u64;
    Some(Space {
        bytes: st.f_blocks as u64 * f,
        free_bytes: st.f_bavail as u64 * f,
        inodes: st.f_files as u64,
        free_inodes: st.f_ffree as u64,
    })
}

/// The image a FUSE mount on `dir` was made from, if it is in the table.
fn source(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    foliofs::device::lock::fuse_mounts()
        .into_iter()
        .rev()
        .find(|m| m.mount_point == dir)
        .map(|m| m.source)
}

/// `foliofs stat --mount DIR [--json] [--watch SECONDS [--count N]]`.
pub fn run(dir: &Path, json: bool, watch: Option<f64>, count: Option<u64>) -> Result<()> {
    let mut prev: Option<(Value, Instant)> = None;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let src = source(dir);
    let mut shown = 0u64;
    loop {
        let now = read_counters(dir)?;
        let t = Instant::now();
        if json {
            println!("{}", serde_json::to_string_pretty(&now)?);
        } else {
            let since = prev
                .as_ref()
                .map(|(v, at)| (v, t.duration_since(*at).as_secs_f64()));
            let page = render(
                dir,
                src.as_deref(),
                &now,
                since,
                space(dir).unwrap_or_default(),
            );
            if watch.is_some() && tty {
                // Redraw in place, as watch(1) does: home, clear.
                print!("\x1b[H\x1b[2J");
            } else if shown > 0 {
                println!();
            }
            print!("{page}");
        }
        shown += 1;
        let Some(secs) = watch else { return Ok(()) };
        if count.is_some_and(|c| shown >= c) {
            return Ok(());
        }
        prev = Some((now, t));
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
}

/// A counter by its path in the JSON ("journal.commits"), 0 when absent
/// (an older daemon).
fn get(v: &Value, path: &str) -> u64 {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// Bytes in binary units, as df -h and free -h print them.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

/// A count with thousands separators.
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn duration(secs: f64) -> String {
    let s = secs as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// The status page. `since`: the previous sample and the seconds since
/// it, for rates over that interval (`--watch`); without it, rates are
/// averages since the mount.
pub fn render(
    dir: &Path,
    source: Option<&str>,
    now: &Value,
    since: Option<(&Value, f64)>,
    space: Space,
) -> String {
    let up = now.get("mounted_secs").and_then(Value::as_f64);
    // Per-second rates: over the last interval, or since the mount.
    let (base, secs) = match since {
        Some((prev, dt)) => (Some(prev), dt),
        None => (None, up.unwrap_or(0.0)),
    };
    let delta = |k: &str| get(now, k).saturating_sub(base.map_or(0, |b| get(b, k)));
    let rate = |k: &str, unit: fn(u64) -> String| {
        if secs > 0.0 {
            format!("{}/s", unit((delta(k) as f64 / secs) as u64))
        } else {
            String::new()
        }
    };
    let mut p = String::new();
    let w = &mut p;
    let _ = writeln!(
        w,
        "foliofs on {}{}",
        dir.display(),
        source.map_or(String::new(), |s| format!(" (image {s})"))
    );
    let transport = match now.get("fuse_transport").and_then(Value::as_str) {
        Some("io_uring") => format!(
            "FUSE over io_uring ({} requests served on rings)",
            count(get(now, "fuse_ring_requests"))
        ),
        Some(t) => format!("{t} (FUSE over io_uring is off: see the mount's log)"),
        None => "unknown (a daemon older than this command)".into(),
    };
    let _ = writeln!(w, "  transport    {transport}");
    if let Some(up) = up {
        let _ = writeln!(w, "  up           {}", duration(up));
    }
    if space.bytes > 0 {
        let used = space.bytes - space.free_bytes.min(space.bytes);
        let _ = writeln!(
            w,
            "  space        {} used of {} ({:.0}%), {} of {} inodes free",
            bytes(used),
            bytes(space.bytes),
            100.0 * used as f64 / space.bytes as f64,
            count(space.free_inodes),
            count(space.inodes)
        );
    }
    let _ = writeln!(
        w,
        "\n{:<34}{:>12}  {}",
        "I/O",
        "total",
        if since.is_some() {
            format!("per second, last {:.0}s", secs)
        } else {
            "per second since mount".into()
        }
    );
    for (name, k) in [
        ("read by programs", "bytes_read_app"),
        ("written by programs", "bytes_written_app"),
        ("written back to the image", "bytes_written_back"),
        ("direct reads", "dio_read_bytes"),
        ("reads past the cache", "uncached_read_bytes"),
        ("direct writes", "dio_write_bytes"),
    ] {
        row(w, name, bytes(get(now, k)), rate(k, bytes));
    }
    row(
        w,
        "fsync calls",
        count(get(now, "fsyncs")),
        rate("fsyncs", count),
    );
    let _ = writeln!(w, "\ncache");
    row(w, "cached", bytes(get(now, "cached_bytes")), String::new());
    row(w, "dirty", bytes(get(now, "dirty_bytes")), String::new());
    row(
        w,
        "writers throttled",
        count(get(now, "throttle_waits")),
        format!(
            "{:.1} s waited in all",
            get(now, "throttle_wait_ns") as f64 / 1e9
        ),
    );
    row(
        w,
        "folios evicted",
        count(get(now, "folios_evicted")),
        rate("folios_evicted", count),
    );
    row(
        w,
        "opens uncached (space short)",
        count(get(now, "fuse_uncached_opens")),
        String::new(),
    );
    let _ = writeln!(w, "\nwriteback");
    row(
        w,
        "passes",
        count(get(now, "writebacks")),
        rate("writebacks", count),
    );
    row(
        w,
        "small overwrites logged",
        bytes(get(now, "overwrite_logged_bytes")),
        rate("overwrite_logged_bytes", bytes),
    );
    row(
        w,
        "large overwrites out of place",
        bytes(get(now, "overwrite_cow_bytes")),
        rate("overwrite_cow_bytes", bytes),
    );
    let _ = writeln!(w, "\njournal");
    row(
        w,
        "commits",
        count(get(now, "journal.commits")),
        rate("journal.commits", count),
    );
    row(
        w,
        "device flushes",
        count(get(now, "journal.flushes") + get(now, "journal.data_flushes")),
        format!(
            "{} for checkpoints, {} for data",
            count(get(now, "journal.checkpoint_flushes")),
            count(get(now, "journal.data_flushes"))
        ),
    );
    row(
        w,
        "checkpoints",
        count(get(now, "journal.checkpoints")),
        format!(
            "{} forced by a full log",
            count(get(now, "journal.checkpoint_stalls"))
        ),
    );
    let (used, all) = (
        get(now, "journal.log_used_blocks"),
        get(now, "journal.log_blocks"),
    );
    row(
        w,
        "log in use",
        format!("{}%", (100 * used).checked_div(all).unwrap_or(0)),
        format!("{} of {} blocks", count(used), count(all)),
    );
    row(
        w,
        "replayed at mount",
        count(get(now, "journal.replayed_transactions")),
        "transactions".into(),
    );
    let _ = writeln!(w, "\nerrors");
    row(
        w,
        "data checksum failures",
        count(get(now, "csum_failures")),
        "reads answered EIO".into(),
    );
    row(
        w,
        "writes refused for space",
        count(get(now, "fuse_enospc_gated")),
        "ENOSPC before the data was taken".into(),
    );
    if let Some(dev) = now.get("device").filter(|d| d.is_object()) {
        object_rows(w, dev, rate("device.wal_bytes", bytes));
    }
    p
}

/// One line of the page: name, total, and what it is per second or of.
fn row(w: &mut String, name: &str, total: String, per: String) {
    let line = format!("  {name:<32}{total:>12}  {per}");
    let _ = writeln!(w, "{}", line.trim_end());
}

/// An object image's part of the page: where its flushes are durable,
/// what has not reached the store, the cache directory.
/// `wal_rate` is the WAL bytes PUT per second.
fn object_rows(w: &mut String, dev: &Value, wal_rate: String) {
    let durability = dev
        .get("durability")
        .and_then(Value::as_str)
        .unwrap_or("object");
    let _ = writeln!(
        w,
        "
object store"
    );
    row(
        w,
        "writer epoch",
        get(dev, "epoch").to_string(),
        match dev.get("fenced").and_then(Value::as_str) {
            Some(why) => format!("writing stopped: {why}"),
            None => format!(
                "manifest {}, next WAL {}",
                get(dev, "manifest"),
                get(dev, "next_wal")
            ),
        },
    );
    row(
        w,
        "WAL PUTs",
        count(get(dev, "wal_puts")),
        format!("{} in all, {}", bytes(get(dev, "wal_bytes")), wal_rate),
    );
    let past = get(dev, "flushes_past_local_wal");
    row(
        w,
        "WAL lag",
        bytes(get(dev, "unshipped_bytes")),
        if past > 0 {
            format!(
                "durability={durability}: flushed, not yet in the store; {} flushes went \
                 to the store, the local WAL unwritable (its disk full?)",
                count(past)
            )
        } else {
            format!("durability={durability}: flushed, not yet in the store")
        },
    );
    row(
        w,
        "chunks",
        count(get(dev, "chunk_gets")),
        format!(
            "GETs; {} PUTs in {} checkpoints, {} written whole by flushes",
            count(get(dev, "chunk_puts")),
            count(get(dev, "checkpoints")),
            count(get(dev, "chunks_flushed"))
        ),
    );
    row(
        w,
        "WAL unfolded",
        bytes(get(dev, "unfolded_bytes")),
        match dev.get("checkpoint_failed").and_then(Value::as_str) {
            Some(why) => format!("in memory; the last checkpoint failed: {why}"),
            None => "in memory, for the next checkpoint".into(),
        },
    );
    if let Some(c) = dev.get("cache_dir").filter(|c| c.is_object()) {
        row(
            w,
            "cache_dir",
            bytes(get(c, "chunk_bytes") + get(c, "wal_bytes")),
            format!(
                "of {} in {} ({} chunks read from it)",
                bytes(get(c, "limit_bytes")),
                c.get("dir").and_then(Value::as_str).unwrap_or("?"),
                count(get(c, "hits"))
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(bytes(1536 << 30), "1.5 TiB");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(count(999), "999");
        assert_eq!(duration(3725.0), "1h 2m");
    }

    #[test]
    fn page_names_the_transport_and_rates() {
        let now = json!({
            "fuse_transport": "io_uring", "fuse_ring_requests": 4096, "mounted_secs": 10.0,
            "bytes_written_app": 100u64 << 20, "csum_failures": 2,
            "journal": {"commits": 50, "log_blocks": 1000, "log_used_blocks": 250},
        });
        let page = render(
            Path::new("/m"),
            Some("/i.img"),
            &now,
            None,
            Space::default(),
        );
        assert!(
            page.contains("FUSE over io_uring (4,096 requests"),
            "{page}"
        );
        // 100 MiB in 10 s since the mount.
        assert!(page.contains("10.0 MiB/s"), "{page}");
        assert!(page.contains("250 of 1,000 blocks"), "{page}");
        assert!(
            page.lines()
                .any(|l| l.contains("data checksum failures") && l.contains(" 2 ")),
            "{page}"
        );
        // Over an interval: the difference, per second of the interval.
        let prev = json!({"bytes_written_app": 90u64 << 20});
        let page = render(
            Path::new("/m"),
            None,
            &now,
            Some((&prev, 2.0)),
            Space::default(),
        );
        assert!(page.contains("5.0 MiB/s"), "{page}");
        let dev = json!({"fuse_transport": "/dev/fuse"});
        let page = render(Path::new("/m"), None, &dev, None, Space::default());
        assert!(
            page.contains("/dev/fuse (FUSE over io_uring is off"),
            "{page}"
        );
    }
}

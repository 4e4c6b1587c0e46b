//! Mount options: the settings, their defaults, and one parser for them
//! by name (`key[=value]`), shared by the FUSE mount's `-o` list, the C ABI
//! and the fio engine.

use serde::Serialize;

/// Mount-time settings.
#[derive(Clone, Debug)]
pub struct MountOptions {
    pub read_only: bool,
    /// Metadata cache size. Default: a 64th of RAM, from 64 MiB to 1 GiB.
    pub meta_cache_bytes: u64,
    /// Dirty data held before writers are made to wait for writeback
    /// (background writeback starts at half). 0, the default: a quarter
    /// of the page cache, as the kernel's dirty_ratio is a share of memory.
    pub dirty_limit_bytes: u64,
    /// Page cache size: clean folios beyond it are evicted (dirty ones
    /// never). Default: an eighth of RAM.
    pub cache_bytes: u64,
    /// Largest folio (default 2 MiB).
    pub max_folio_bytes: u64,
    /// Knob: every folio this size, whatever the I/O (benchmarks).
    pub fixed_folio_bytes: Option<u64>,
    /// Knob: a write dirties its whole folio, not just its blocks (the
    /// behaviour before per-block dirty tracking; benchmarks).
    pub whole_folio_dirty: bool,
    /// Largest device request a direct I/O issues, in blocks (>= 1).
    pub dio_max_blocks: u64,
    /// Lock mode for direct overwrites.
    pub dio_lock: DioLock,
    /// Writeback contexts (threads); each inode belongs to the one of its
    /// AG. 0: one per AG, up to `MAX_WB_CONTEXTS`. Knob: 1.
    pub writeback_contexts: usize,
    /// How often the writeback contexts wake to write back old dirty data
    /// and commit the journal (0: never; only thresholds, sync and fsync).
    pub writeback_interval_ms: u64,
    /// Dirty data older than this is written back by the periodic pass.
    pub dirty_expire_ms: u64,
    /// Knob: map and reserve by the write's byte range, as the seed's
    /// regression did, instead of whole blocks with speculative
    /// preallocation past EOF.
    pub map_by_write_length: bool,
    /// Knob: no speculative preallocation past EOF.
    pub no_prealloc: bool,
    /// Write-behind: once a file's sequential writer has dirtied this
    /// much since its last writeback, the whole folios behind it are
    /// written back at once, below the background threshold, so a
    /// stream keeps the device busy instead of waiting for dirty memory
    /// to fill (and its fsync finds little left to write). 0: off.
    pub write_behind_bytes: u64,
    /// When reads update the access time.
    pub atime: Atime,
    /// Directories' access times are never updated.
    pub no_diratime: bool,
    /// Overwrites of written blocks go through the journal (the overwrite
    /// log, default): their data and checksums are committed together and
    /// written home later. Off: the scheme before it, a "no checksum"
    /// intent committed before an in-place write (benchmarks).
    pub overwrite_log: bool,
    /// Overwrites of at least this many bytes in one contiguous run are
    /// written out of place instead of logged (the data is not written
    /// twice). Default 256 KiB; capped by the log's size.
    pub overwrite_log_max: u64,
    /// Every change is durable before the call that made it returns
    /// (mount option `sync`): writes as with O_SYNC, and namespace,
    /// attribute and xattr changes committed at once.
    pub sync: bool,
    /// Drop-behind: a folio leaves the cache once its writeback has
    /// completed and nothing has dirtied it since, its memory going to the
    /// next writes. For a caller that caches what it writes itself (the
    /// FUSE mount: the kernel's page cache holds the same bytes), so that
    /// a stream of writes keeps them in memory once, and reuses the
    /// engine's buffers instead of mapping fresh memory (which the kernel
    /// zeroes) for every folio. And a large read of blocks no folio
    /// holds (the kernel's read-ahead, 128 KiB or more, whole blocks)
    /// goes from the device straight into the caller's buffer, checked,
    /// instead of through new folios (`Fs::read_past_cache`). Off by
    /// default; the mount turns it on.
    pub drop_behind: bool,
    /// Read-ahead for sequential direct readers: when a direct read
    /// starts where the file's last one ended, the next one (the same
    /// length, up to 4 MiB) is read and checked on a thread meanwhile,
    /// and served from memory if nothing changed the file since
    /// (`data/ahead.rs`). For a caller between the reader and the engine
    /// (the FUSE mount: its round trip would leave the device idle). Off
    /// by default; the mount turns it on.
    pub direct_read_ahead: bool,
    /// Changes to directories are durable before the call returns
    /// (mount option `dirsync`): create, link, unlink, rename, mkdir,
    /// rmdir, mknod, symlink.
    pub dirsync: bool,
}

/// When a read updates the access time (mount options `relatime`,
/// `noatime`, `strictatime`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Atime {
    /// When atime is not newer than mtime or ctime, or is a day old: a
    /// program can tell whether a file was read since it last changed, at
    /// the price of at most one inode update a day per file otherwise.
    #[default]
    Relatime,
    /// Never.
    Noatime,
    /// Every read.
    Strictatime,
}

/// The machine's memory in bytes, if /proc/meminfo says.
fn memory_bytes() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// An eighth of the machine's memory (256 MiB if it cannot be read).
fn default_cache_bytes() -> u64 {
    memory_bytes().map_or(256 << 20, |m| m / 8)
}

/// A 64th of the machine's memory, from 64 MiB to 1 GiB: room for the
/// inode tables and directories of a few hundred thousand files (a
/// kernel file system keeps them in the page cache, bounded by memory
/// alone). 300,000 unlinks in random order on an image file took 70 µs
/// each with 64 MiB and 25 µs with 512 MiB (2026-11-26).
fn default_meta_cache_bytes() -> u64 {
    memory_bytes().map_or(64 << 20, |m| (m / 64).clamp(64 << 20, 1 << 30))
}

/// How direct writes that only overwrite take the inode I/O lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum DioLock {
    /// Shared, so overwrites of one file run in parallel (the default).
    SharedOverwrite,
    /// Exclusive for every direct write (the behaviour before the
    /// technique; a benchmark knob).
    Exclusive,
}

/// Most writeback contexts (threads) a mount runs.
pub const MAX_WB_CONTEXTS: usize = 16;

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            atime: Atime::default(),
            no_diratime: false,
            meta_cache_bytes: default_meta_cache_bytes(),
            dirty_limit_bytes: 0,
            cache_bytes: default_cache_bytes(),
            max_folio_bytes: 2 << 20,
            fixed_folio_bytes: None,
            whole_folio_dirty: false,
            dio_max_blocks: 256,
            dio_lock: DioLock::SharedOverwrite,
            writeback_contexts: 0,
            writeback_interval_ms: 5000,
            dirty_expire_ms: 30000,
            map_by_write_length: false,
            no_prealloc: false,
            write_behind_bytes: 8 << 20,
            overwrite_log: true,
            overwrite_log_max: 256 << 10,
            sync: false,
            dirsync: false,
            drop_behind: false,
            direct_read_ahead: false,
        }
    }
}

/// A size such as `4096`, `64K`, `512MiB` or `1G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match s[i..]
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 1u64,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                u => return Err(format!("unknown size unit {u:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s} is too large"))
}

/// The engine's option names, for messages.
pub const ENGINE_OPTIONS: &str = "ro, rw, cache_size=SIZE, dirty_limit=SIZE, page_cache=SIZE, \
     wb_contexts=N, prealloc=on|off, write_behind=SIZE (0: off), dio_cap=BLOCKS, \
     dio_lock=shared|exclusive, overwrite_log=on|off, overwrite_log_max=SIZE, drop_behind=on|off, dio_ahead=on|off, relatime, noatime, strictatime, nodiratime, \
     sync, async, dirsync";

impl MountOptions {
    /// Apply one option. `Ok(false)`: not an engine option (the caller
    /// may know it); `Err`: an engine option with a bad value.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<bool, String> {
        let size = |v: &str| parse_size(v).map_err(|e| format!("{key}={v}: {e}"));
        match (key, value) {
            ("ro", None) => self.read_only = true,
            ("rw", None) => self.read_only = false,
            ("cache_size", Some(v)) => self.meta_cache_bytes = size(v)?,
            ("dirty_limit", Some(v)) => self.dirty_limit_bytes = size(v)?,
            ("page_cache", Some(v)) => self.cache_bytes = size(v)?,
            ("write_behind", Some(v)) => self.write_behind_bytes = size(v)?,
            ("wb_contexts", Some(v)) => {
                self.writeback_contexts = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_WB_CONTEXTS).contains(n))
                    .ok_or_else(|| format!("wb_contexts={v}: want 1 to {MAX_WB_CONTEXTS}"))?
            }
            ("prealloc", Some("on")) => self.no_prealloc = false,
            ("prealloc", Some("off")) => self.no_prealloc = true,
            ("dio_cap", Some(v)) => {
                self.dio_max_blocks = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("dio_cap={v}: want a block count >= 1"))?
            }
            ("relatime" | "atime", None) => self.atime = Atime::Relatime,
            ("noatime", None) => self.atime = Atime::Noatime,
            ("strictatime", None) => self.atime = Atime::Strictatime,
            ("nodiratime", None) => self.no_diratime = true,
            ("sync", None) => self.sync = true,
            ("async", None) => self.sync = false,
            ("dirsync", None) => self.dirsync = true,
            ("diratime", None) => self.no_diratime = false,
            ("drop_behind", Some("on")) => self.drop_behind = true,
            ("drop_behind", Some("off")) => self.drop_behind = false,
            ("dio_ahead", Some("on")) => self.direct_read_ahead = true,
            ("dio_ahead", Some("off")) => self.direct_read_ahead = false,
            ("overwrite_log", Some("on")) => self.overwrite_log = true,
            ("overwrite_log", Some("off")) => self.overwrite_log = false,
            ("overwrite_log_max", Some(v)) => self.overwrite_log_max = size(v)?,
            ("dio_lock", Some("shared")) => self.dio_lock = DioLock::SharedOverwrite,
            ("dio_lock", Some("exclusive")) => self.dio_lock = DioLock::Exclusive,
            (
                "prealloc" | "dio_lock" | "overwrite_log" | "drop_behind" | "dio_ahead" | "ro"
                | "rw",
                _,
            ) => return Err(format!("bad value for mount option {key}")),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Apply a comma-separated list of engine options; any other name is
    /// an error.
    pub fn parse(list: &str) -> Result<MountOptions, String> {
        let mut o = MountOptions::default();
        for opt in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            if !o.set(k, v)? {
                return Err(format!(
                    "unknown mount option '{opt}' (known: {ENGINE_OPTIONS})"
                ));
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn options() {
        let o =
            MountOptions::parse("wb_contexts=2, page_cache=64M,prealloc=off,ro,write_behind=4M")
                .unwrap();
        assert_eq!(o.write_behind_bytes, 4 << 20);
        assert_eq!(o.writeback_contexts, 2);
        assert_eq!(o.cache_bytes, 64 << 20);
        assert!(o.no_prealloc && o.read_only);
        assert!(MountOptions::parse("wb_contexts=0").is_err());
        assert!(MountOptions::parse("dio_lock=maybe").is_err());
        let o = MountOptions::parse("overwrite_log=off,overwrite_log_max=1M").unwrap();
        assert!(!o.overwrite_log);
        assert_eq!(o.overwrite_log_max, 1 << 20);
        assert!(MountOptions::parse("").unwrap().overwrite_log);
        assert!(MountOptions::parse("overwrite_log=maybe").is_err());
        let o = MountOptions::parse("sync,dirsync").unwrap();
        assert!(o.sync && o.dirsync);
        assert!(!MountOptions::parse("sync,async").unwrap().sync);
        assert!(MountOptions::parse("sync=1").is_err());
        assert!(MountOptions::parse("allow_other").is_err());
        assert_eq!(MountOptions::parse("").unwrap().atime, Atime::Relatime);
        let o = MountOptions::parse("noatime,nodiratime").unwrap();
        assert!(o.atime == Atime::Noatime && o.no_diratime);
        assert!(MountOptions::parse("noatime=1").is_err());
        assert_eq!(MountOptions::default().set("threads", Some("2")), Ok(false));
    }
}

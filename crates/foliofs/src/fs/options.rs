//! Mount options by name, as `key[=value]` strings: one parser for the
//! FUSE mount's `-o` list, the C ABI and the fio engine.

use super::{Atime, DioLock, MountOptions, MAX_WB_CONTEXTS};

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
     dio_lock=shared|exclusive, relatime, noatime, strictatime, nodiratime";

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
            ("diratime", None) => self.no_diratime = false,
            ("dio_lock", Some("shared")) => self.dio_lock = DioLock::SharedOverwrite,
            ("dio_lock", Some("exclusive")) => self.dio_lock = DioLock::Exclusive,
            ("prealloc" | "dio_lock" | "ro" | "rw", _) => {
                return Err(format!("bad value for mount option {key}"))
            }
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
        assert!(MountOptions::parse("allow_other").is_err());
        assert_eq!(MountOptions::parse("").unwrap().atime, Atime::Relatime);
        let o = MountOptions::parse("noatime,nodiratime").unwrap();
        assert!(o.atime == Atime::Noatime && o.no_diratime);
        assert!(MountOptions::parse("noatime=1").is_err());
        assert_eq!(MountOptions::default().set("threads", Some("2")), Ok(false));
    }
}

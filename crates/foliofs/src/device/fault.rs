//! A device that starts failing while in use: a disk going bad under a
//! mounted image, for tests of what programs see then
//! (`foliofs mount -o fault_injection`, switched by the `foliofs.fault`
//! xattr of the mount's root). Until switched it passes everything on.

use super::Device;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Which operations fail from now on.
#[derive(Debug, Default)]
pub struct Faults {
    pub reads: AtomicBool,
    pub writes: AtomicBool,
    pub flushes: AtomicBool,
}

impl Faults {
    /// Set from a comma-separated list of `reads`, `writes`, `flushes`
    /// (the others stop failing); `none` for none.
    pub fn set(&self, spec: &str) -> Result<(), String> {
        let (mut r, mut w, mut f) = (false, false, false);
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "reads" => r = true,
                "writes" => w = true,
                "flushes" => f = true,
                "none" => {}
                _ => {
                    return Err(format!(
                        "unknown fault '{part}' (known: reads, writes, flushes, none)"
                    ))
                }
            }
        }
        self.reads.store(r, Ordering::Release);
        self.writes.store(w, Ordering::Release);
        self.flushes.store(f, Ordering::Release);
        Ok(())
    }
}

pub struct FaultDevice {
    inner: Arc<dyn Device>,
    faults: Arc<Faults>,
}

impl FaultDevice {
    pub fn new(inner: Arc<dyn Device>) -> Self {
        FaultDevice {
            inner,
            faults: Arc::default(),
        }
    }

    /// The switches.
    pub fn faults(&self) -> Arc<Faults> {
        self.faults.clone()
    }
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected {what} fault"))
}

impl Device for FaultDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.faults.reads.load(Ordering::Acquire) {
            return Err(injected("read"));
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.faults.writes.load(Ordering::Acquire) {
            return Err(injected("write"));
        }
        self.inner.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        if self.faults.writes.load(Ordering::Acquire) {
            return Err(injected("write"));
        }
        self.inner.write_vectored_at(bufs, offset)
    }
    fn flush(&self) -> io::Result<()> {
        if self.faults.flushes.load(Ordering::Acquire) {
            return Err(injected("flush"));
        }
        self.inner.flush()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    #[test]
    fn faults_switch_on_and_off() {
        let d = FaultDevice::new(Arc::new(MemDevice::new(1 << 20)));
        let f = d.faults();
        d.write_at(&[1; 4096], 0).unwrap();
        f.set("writes,flushes").unwrap();
        assert!(d.write_at(&[2; 4096], 0).is_err());
        assert!(d.write_vectored_at(&[&[2; 4096]], 0).is_err());
        assert!(d.flush().is_err());
        let mut b = [0u8; 4096];
        d.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [1; 4096]);
        f.set("none").unwrap();
        d.write_at(&[3; 4096], 0).unwrap();
        d.flush().unwrap();
        assert!(f.set("writes,bogus").is_err());
    }
}

use super::Device;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

/// A copy-on-write view of another device: writes land in memory, reads
/// see them. Lets a read-only fsck replay the journal without touching the
/// device. Writes must be whole, aligned `unit`-byte blocks.
pub struct OverlayDevice {
    base: Arc<dyn Device>,
    unit: u64,
    blocks: Mutex<HashMap<u64, Vec<u8>>>,
}

impl OverlayDevice {
    pub fn new(base: Arc<dyn Device>, unit: u64) -> Self {
        OverlayDevice {
            base,
            unit,
            blocks: Mutex::new(HashMap::new()),
        }
    }
}

impl Device for OverlayDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.base.read_at(buf, offset)?;
        let blocks = self.blocks.lock();
        if blocks.is_empty() {
            return Ok(());
        }
        let u = self.unit;
        let first = offset / u;
        let last = (offset + buf.len() as u64).div_ceil(u);
        for b in first..last {
            if let Some(data) = blocks.get(&b) {
                let s = (b * u).max(offset);
                let e = ((b + 1) * u).min(offset + buf.len() as u64);
                buf[(s - offset) as usize..(e - offset) as usize]
                    .copy_from_slice(&data[(s - b * u) as usize..(e - b * u) as usize]);
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let u = self.unit;
        if offset % u != 0 || buf.len() as u64 % u != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unaligned overlay write",
            ));
        }
        let mut blocks = self.blocks.lock();
        for (i, chunk) in buf.chunks(u as usize).enumerate() {
            blocks.insert(offset / u + i as u64, chunk.to_vec());
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> u64 {
        self.base.len()
    }
}

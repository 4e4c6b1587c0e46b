use super::Device;
use parking_lot::RwLock;
use std::io;

/// A device held in memory. Flush does nothing: memory never loses writes.
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    pub fn new(len: u64) -> Self {
        MemDevice {
            data: RwLock::new(vec![0; len as usize]),
        }
    }

    pub fn from_image(image: Vec<u8>) -> Self {
        MemDevice {
            data: RwLock::new(image),
        }
    }

    /// A copy of the whole device.
    pub fn image(&self) -> Vec<u8> {
        self.data.read().clone()
    }

    /// Change bytes behind the engine's back (corruption tests).
    pub fn poke(&self, offset: u64, bytes: &[u8]) {
        let mut d = self.data.write();
        d[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
    }
}

pub(super) fn check_range(len: u64, offset: u64, n: usize) -> io::Result<()> {
    if offset.checked_add(n as u64).is_none_or(|end| end > len) {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("I/O of {n} bytes at {offset} is past the device end {len}"),
        ));
    }
    Ok(())
}

impl Device for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let d = self.data.read();
        check_range(d.len() as u64, offset, buf.len())?;
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut d = self.data.write();
        check_range(d.len() as u64, offset, buf.len())?;
        d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> u64 {
        self.data.read().len() as u64
    }
}

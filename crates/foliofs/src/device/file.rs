use super::{AlignedBuf, Device, IO_ALIGN};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// An image file or block device, opened with O_DIRECT so that the engine's
/// own cache is the only one. Falls back to buffered I/O where the file
/// system under the image refuses O_DIRECT (tmpfs), and says so.
pub struct FileDevice {
    file: File,
    len: u64,
    direct: bool,
}

impl FileDevice {
    pub fn open(path: &Path, writable: bool) -> io::Result<Self> {
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(writable)
                .custom_flags(flags)
                .open(path)
        };
        let (file, direct) = match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(0)?, false),
            Err(e) => return Err(e),
        };
        let len = device_len(&file)?;
        Ok(FileDevice { file, len, direct })
    }

    /// Whether I/O bypasses the host page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn aligned(&self, ptr: *const u8, len: usize, offset: u64) -> bool {
        !self.direct || ((ptr as usize) % IO_ALIGN == 0 && len % 512 == 0 && offset % 512 == 0)
    }
}

fn device_len(file: &File) -> io::Result<u64> {
    let meta = file.metadata()?;
    use std::os::unix::fs::FileTypeExt;
    if meta.file_type().is_block_device() {
        let mut size: u64 = 0;
        // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
        const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
        use std::os::fd::AsRawFd;
        // SAFETY: the ioctl writes one u64 into `size`.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(size)
    } else {
        Ok(meta.len())
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        super::mem::check_range(self.len, offset, buf.len())?;
        if self.aligned(buf.as_ptr(), buf.len(), offset) {
            return self.file.read_exact_at(buf, offset);
        }
        let mut bounce = AlignedBuf::zeroed(buf.len().next_multiple_of(512));
        self.file.read_exact_at(&mut bounce, offset)?;
        buf.copy_from_slice(&bounce[..buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        super::mem::check_range(self.len, offset, buf.len())?;
        if self.aligned(buf.as_ptr(), buf.len(), offset) {
            return self.file.write_all_at(buf, offset);
        }
        let mut bounce = AlignedBuf::zeroed(buf.len());
        bounce.copy_from_slice(buf);
        self.file.write_all_at(&bounce, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> u64 {
        self.len
    }
}

use super::{AlignedBuf, Device, IO_ALIGN};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// An image file or block device, opened with O_DIRECT so that the engine's
/// own cache is the only one. Falls back to buffered I/O where the file
/// system under the image refuses O_DIRECT (tmpfs), and says so.
/// Most iovecs one pwritev takes (Linux's UIO_MAXIOV).
const IOV_MAX: usize = 1024;

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

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        super::mem::check_range(self.len, offset, total)?;
        let aligned = bufs
            .iter()
            .all(|b| self.aligned(b.as_ptr(), b.len(), offset));
        if !aligned || bufs.len() > IOV_MAX {
            return super::write_each(self, bufs, offset);
        }
        let mut iov: Vec<libc::iovec> = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let (mut first, mut at) = (0, offset);
        use std::os::fd::AsRawFd;
        while first < iov.len() {
            // SAFETY: the iovecs describe live slices borrowed for this
            // call; the kernel only reads them.
            let n = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    iov[first..].as_ptr(),
                    (iov.len() - first) as libc::c_int,
                    at as libc::off_t,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            // Skip what was written: whole iovecs, then part of one.
            let mut n = n as usize;
            at += n as u64;
            while n > 0 && n >= iov[first].iov_len {
                n -= iov[first].iov_len;
                first += 1;
            }
            if n > 0 {
                // SAFETY: n < iov_len, so the base stays in the slice.
                iov[first].iov_base = unsafe { iov[first].iov_base.cast::<u8>().add(n) }.cast();
                iov[first].iov_len -= n;
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> u64 {
        self.len
    }
}

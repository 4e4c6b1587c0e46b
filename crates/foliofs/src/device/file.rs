use super::{lock, AlignedBuf, Device, IO_ALIGN};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

/// Most iovecs one pwritev takes (Linux's UIO_MAXIOV): a longer list is
/// written in several calls.
const IOV_MAX: usize = 1024;

/// An image file or block device, opened with O_DIRECT so that the engine's
/// own cache is the only one. Falls back to buffered I/O where the file
/// system under the image refuses O_DIRECT (tmpfs), and says so. The
/// opener owns the image while it is open (see `device::lock`).
pub struct FileDevice {
    file: File,
    len: u64,
    direct: bool,
}

/// How to open an image.
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    pub writable: bool,
    /// Take the image's owner lock (the default). Off only to look at an
    /// image that may be in use (`fsck -n`), knowing it may change.
    pub lock: bool,
    /// Carry the daemon mark: an opener that finds the image locked waits
    /// for this owner once its mount is gone, instead of failing.
    pub daemon: bool,
    /// How long to wait for a daemon finishing after its unmount.
    pub wait: Duration,
    /// Open a block device O_EXCL (with `lock`), which keeps kernel
    /// mounts and other exclusive openers out. Off for a fuseblk mount,
    /// whose kernel side claims the device itself.
    pub exclusive: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            writable: true,
            lock: true,
            daemon: false,
            wait: lock::DEFAULT_WAIT,
            exclusive: true,
        }
    }
}

impl FileDevice {
    /// Open and own the image (see `open_with`).
    pub fn open(path: &Path, writable: bool) -> io::Result<Self> {
        Self::open_with(
            path,
            &DeviceOptions {
                writable,
                ..Default::default()
            },
        )
    }

    /// Open an image. With `o.lock` the caller becomes its only owner or
    /// gets `ErrorKind::ResourceBusy` naming the holder; a daemon that is
    /// finishing after its unmount is waited for, up to `o.wait`.
    pub fn open_with(path: &Path, o: &DeviceOptions) -> io::Result<Self> {
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(o.writable)
                .custom_flags(flags)
                .open(path)
        };
        let block_dev = std::fs::metadata(path)?.file_type().is_block_device();
        // Block devices also open O_EXCL, which keeps kernel mounts (and
        // other exclusive openers) out for as long as we hold them.
        let excl = if block_dev && o.lock && o.exclusive {
            libc::O_EXCL
        } else {
            0
        };
        let open_direct = || match open(libc::O_DIRECT | excl) {
            Ok(f) => Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((open(excl)?, false)),
            Err(e) => Err(e),
        };
        let (file, direct) = if o.lock {
            let mut direct = true;
            let file = lock::acquire(
                path,
                o.wait,
                || {
                    let (f, d) = match open_direct() {
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(None),
                        r => r?,
                    };
                    direct = d;
                    Ok(lock::try_own(&f)?.then_some(f))
                },
                || File::open(path),
            )?;
            (file, direct)
        } else {
            open_direct()?
        };
        if o.daemon {
            lock::mark_daemon(&file, true)?;
        }
        let len = device_len(&file)?;
        Ok(FileDevice { file, len, direct })
    }

    /// Whether I/O bypasses the host page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Set the size of an image file (mkfs); a block device keeps its own.
    pub fn set_len(&mut self, bytes: u64) -> io::Result<()> {
        if self.file.metadata()?.file_type().is_file() {
            self.file.set_len(bytes)?;
            self.len = bytes;
        }
        Ok(())
    }

    fn aligned(&self, ptr: *const u8, len: usize, offset: u64) -> bool {
        !self.direct || ((ptr as usize) % IO_ALIGN == 0 && len % 512 == 0 && offset % 512 == 0)
    }
}

fn device_len(file: &File) -> io::Result<u64> {
    let meta = file.metadata()?;
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
        if !aligned {
            return super::write_each(self, bufs, offset);
        }
        write_all_vectored_at(&self.file, bufs, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> u64 {
        self.len
    }
}

/// `bufs`, one after another, written to `file` at `offset` by vectored
/// writes (`pwritev`), `IOV_MAX` at a time, going on after short writes.
pub fn write_all_vectored_at(file: &File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut iov: Vec<libc::iovec> = bufs
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let (mut first, mut at) = (0, offset);
    while first < iov.len() {
        // SAFETY: the iovecs describe live slices borrowed for this
        // call; the kernel only reads them.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov[first..].as_ptr(),
                (iov.len() - first).min(IOV_MAX) as libc::c_int,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// More buffers than one pwritev takes go out in several calls, each
    /// at its place, aligned ones without a copy.
    #[test]
    fn a_gathered_write_longer_than_the_iovec_limit_lands_whole() {
        let dir = std::env::temp_dir().join(format!("foliofs-iov-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("img");
        let n = IOV_MAX * 3 / 2;
        File::create(&path)
            .unwrap()
            .set_len((n as u64 + 2) * 4096)
            .unwrap();
        let dev = FileDevice::open(&path, true).unwrap();
        let blocks: Vec<AlignedBuf> = (0..n)
            .map(|i| {
                let mut b = AlignedBuf::zeroed(4096);
                b.fill((i % 251) as u8 + 1);
                b
            })
            .collect();
        let bufs: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
        dev.write_vectored_at(&bufs, 4096).unwrap();
        let mut got = AlignedBuf::zeroed((n + 2) * 4096);
        dev.read_at(&mut got, 0).unwrap();
        assert!(got[..4096].iter().all(|&x| x == 0));
        for i in 0..n {
            let at = (i + 1) * 4096;
            assert!(
                got[at..at + 4096].iter().all(|&x| x == (i % 251) as u8 + 1),
                "block {i}"
            );
        }
        assert!(got[(n + 1) * 4096..].iter().all(|&x| x == 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

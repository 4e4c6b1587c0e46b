//! The engine runner: a fresh image with the engine mounted in this
//! process, the workload files on it, and the raw image file opened with
//! O_DIRECT at the same device addresses for the raw-device pass. An
//! object image (`--image s3://...`) is made by `object` instead, with no
//! raw pass.

use super::args::BenchArgs;
use super::report::fill;
use anyhow::{bail, Context, Result};
use foliofs::device::{AlignedBuf, Device, FileDevice};
use foliofs::{Fs, MkfsOptions, MountOptions};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Arc;
use std::time::Instant;

/// A fresh file system on the bench image, big enough for `file_mib`.
pub(super) fn fresh_fs(args: &BenchArgs) -> Result<(Arc<dyn Device>, Fs)> {
    let size = ((args.file_mib + args.file_mib / 8 + 256) << 20).max(512 << 20);
    if let Some(url) = crate::object::url_of(&args.image) {
        return super::object::fresh_fs(url, size, args);
    }
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&args.image)
        .with_context(|| format!("cannot create {}", args.image.display()))?;
    f.set_len(size)?;
    drop(f);
    let dev = Arc::new(FileDevice::open(&args.image, true)?);
    if !dev.is_direct() {
        bail!(
            "{} does not support O_DIRECT (tmpfs?): put --image on a disk",
            args.image.display()
        );
    }
    // Written in full once, so the image behaves like a device: a first
    // write into a sparse image file makes the host file system allocate
    // (and, for O_DIRECT, convert unwritten extents), which a device never
    // does and which only the first writer of a range would pay.
    let zeros = AlignedBuf::zeroed(8 << 20);
    let mut at = 0;
    while at < size {
        let n = (size - at).min(zeros.len() as u64) as usize;
        dev.write_at(&zeros[..n], at)?;
        at += n as u64;
    }
    dev.flush()?;
    foliofs::mkfs(&*dev, &MkfsOptions::default(), |_, _| {})?;
    let fs = Fs::mount(dev.clone(), MountOptions::default())?;
    Ok((dev, fs))
}

/// Device byte ranges (offset, len) holding the file, in file order.
pub(super) fn file_ranges(fs: &Fs, ino: u64) -> Result<Vec<(u64, u64)>> {
    let bs = fs.block_size();
    Ok(fs
        .extents(ino)?
        .into_iter()
        .map(|e| (e.device_block * bs, e.blocks * bs))
        .collect())
}

/// The image file opened with O_DIRECT for the raw pass; None without
/// one (`--raw false`, an object image).
pub(super) fn open_raw_if(args: &BenchArgs) -> Result<Option<File>> {
    args.raw.then(|| open_raw(args)).transpose()
}

pub(super) fn open_raw(args: &BenchArgs) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&args.image)
        .with_context(|| format!("cannot open {} with O_DIRECT", args.image.display()))
}

/// Read the file's bytes at file offset `pos` straight from the image
/// (the same device ranges the engine reads).
pub(super) fn raw_read_at(
    raw: &File,
    ranges: &[(u64, u64)],
    pos: u64,
    buf: &mut [u8],
) -> Result<()> {
    for (dev_off, r) in device_pieces(ranges, pos, buf.len()) {
        raw.read_exact_at(&mut buf[r], dev_off)?;
    }
    Ok(())
}

/// Write the file's bytes at file offset `pos` straight into the image.
pub(super) fn raw_write_at(raw: &File, ranges: &[(u64, u64)], pos: u64, buf: &[u8]) -> Result<()> {
    for (dev_off, r) in device_pieces(ranges, pos, buf.len()) {
        raw.write_all_at(&buf[r], dev_off)?;
    }
    Ok(())
}

/// Where file bytes [pos, pos + len) lie on the device: (device offset,
/// range of the buffer) per piece, given the file's device ranges.
pub(super) fn device_pieces(
    ranges: &[(u64, u64)],
    pos: u64,
    len: usize,
) -> Vec<(u64, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut file_off = 0u64;
    let mut done = 0usize;
    for &(dev_off, rlen) in ranges {
        if done == len {
            break;
        }
        let want = pos + done as u64;
        if want >= file_off + rlen {
            file_off += rlen;
            continue;
        }
        let inside = want - file_off;
        let n = ((rlen - inside) as usize).min(len - done);
        out.push((dev_off + inside, done..done + n));
        done += n;
        file_off += rlen;
    }
    out
}

/// MiB/s of `n` threads each filling 1 MiB buffers as the W4 writers do
/// and copying them into memory already mapped (as a page cache that
/// recycles its pages has it), `mib` MiB per thread: the CPU work a
/// buffered write path cannot avoid, without any file system or device.
pub(super) fn copy_rate(n: usize, mib: u64) -> Result<f64> {
    let pages: Vec<Vec<AlignedBuf>> = (0..n)
        .map(|_| (0..mib).map(|_| AlignedBuf::zeroed(1 << 20)).collect())
        .collect();
    let t = Instant::now();
    let handles: Vec<_> = pages
        .into_iter()
        .map(|mut pages| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                for (m, page) in pages.iter_mut().enumerate() {
                    fill(&mut buf, ((m as u64) << 20) / 4096, 4096);
                    page.copy_from_slice(&buf);
                }
                pages
            })
        })
        .collect();
    let mut kept = Vec::new();
    for h in handles {
        kept.push(
            h.join()
                .map_err(|_| anyhow::anyhow!("copy thread panicked"))?,
        );
    }
    let rate = (n as u64 * mib) as f64 / t.elapsed().as_secs_f64();
    drop(kept);
    Ok(rate)
}

//! The device: a small trait, and its implementations.
//!
//! Everything the engine reads or writes goes through [`Device`]; nothing in
//! the engine opens files behind its back. [`FileDevice`] is an image file or
//! block device opened with O_DIRECT; [`MemDevice`] lives in memory;
//! [`CrashDevice`] records every write between flushes so tests can build the
//! device as it would be after a power cut, and can inject I/O errors.

mod crash;
mod fault;
mod file;
pub mod lock;
mod mem;
mod overlay;

pub use crash::{CrashDevice, CrashLog, FaultPlan};
pub use fault::{FaultDevice, Faults};
pub use file::{write_all_vectored_at, DeviceOptions, FileDevice};
pub use mem::MemDevice;
pub use overlay::OverlayDevice;

use std::alloc::{self, Layout};
use std::io;
use std::ops::{Deref, DerefMut};

/// Alignment of every engine I/O buffer: 4096 bytes satisfies O_DIRECT on any
/// device this engine supports (the machine reports 512-byte DIO alignment).
pub const IO_ALIGN: usize = 4096;

/// A block device. Offsets and lengths the engine passes are multiples of
/// the file system block size.
pub trait Device: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Write `bufs` one after another from `offset` (a gathered write:
    /// one device request where the device can take it as one).
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        write_each(self, bufs, offset)
    }
    /// Make every completed write durable (fdatasync for files).
    fn flush(&self) -> io::Result<()>;
    /// Wait until what the device does in the background after a flush
    /// is done (an object image: shipping its local WAL, folding the WAL
    /// into chunks), so that what runs next does not share the machine
    /// with it; a benchmark calls it between passes. Durability does not
    /// depend on it: a flush has made its writes durable already.
    fn settle(&self) -> io::Result<()> {
        Ok(())
    }
    /// Size in bytes.
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Write `bufs` one after another from `offset`, a request each.
fn write_each<D: Device + ?Sized>(dev: &D, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    let mut at = offset;
    for b in bufs {
        dev.write_at(b, at)?;
        at += b.len() as u64;
    }
    Ok(())
}

/// A heap buffer aligned to [`IO_ALIGN`], so that O_DIRECT needs no bounce.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads, like &[u8].
unsafe impl Sync for AlignedBuf {}

/// Buffers this large come straight from mmap and go back to the kernel
/// when dropped, so large folios and I/O buffers never leave freed memory
/// resident in an allocator arena.
const MMAP_MIN: usize = 64 << 10;

/// Freed small buffers (whole blocks below `MMAP_MIN`), by length in
/// blocks, for reuse: the journal and the metadata cache take and drop a
/// few per operation, and the allocator's page-aligned path is slow and
/// gives trimmed memory back to the kernel, to fault in again.
static SMALL: [parking_lot::Mutex<Vec<usize>>; MMAP_MIN / IO_ALIGN] =
    [const { parking_lot::Mutex::new(Vec::new()) }; MMAP_MIN / IO_ALIGN];

/// Buffers of whole multiples of this many bytes are mapped aligned to
/// it and asked to be backed by transparent huge pages (`map_huge`), so
/// that a device request for a buffer of them is a few physically
/// contiguous segments rather than one per 4 KiB page. The virtio disk
/// here takes at most 254 segments per request: a 1 MiB O_DIRECT read
/// into 4 KiB pages went out as two requests, the second only after the
/// first, and ran at 0.2–0.25 of the same read into a huge page (1 MiB
/// reads at QD1 of a file on this machine, alternated: 414–468 MB/s
/// against 1,900–2,200).
pub const HUGE_PAGE: usize = 2 << 20;

/// Bytes of freed buffers kept per length.
const SMALL_KEEP: usize = 256 << 10;

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        Self::alloc(len, true)
    }

    /// A buffer of `len` bytes to be overwritten whole at once: its
    /// contents are unspecified (zero or an earlier buffer's bytes).
    pub fn for_overwrite(len: usize) -> Self {
        Self::alloc(len, false)
    }

    /// A buffer holding a copy of `src`, its bytes written once: a fresh
    /// allocation is not zeroed first.
    pub fn copy_of(src: &[u8]) -> Self {
        let len = src.len();
        if len == 0 || len >= MMAP_MIN || len % IO_ALIGN != 0 {
            let mut b = Self::alloc(len, false);
            b.copy_from_slice(src);
            return b;
        }
        let ptr = match SMALL[len / IO_ALIGN].lock().pop() {
            Some(p) => p as *mut u8,
            None => {
                let layout = Layout::from_size_align(len, IO_ALIGN).expect("buffer layout");
                // SAFETY: layout has non-zero size.
                let p = unsafe { alloc::alloc(layout) };
                if p.is_null() {
                    alloc::handle_alloc_error(layout);
                }
                p
            }
        };
        // SAFETY: ptr is valid for len bytes and ours alone; every byte is
        // written here before any slice of the buffer exists.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr, len) };
        AlignedBuf { ptr, len }
    }

    fn alloc(len: usize, zero: bool) -> Self {
        if len == 0 {
            return AlignedBuf {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
            };
        }
        if len % HUGE_PAGE == 0 {
            if let Some(p) = map_huge(len) {
                return AlignedBuf { ptr: p, len };
            }
        }
        if len >= MMAP_MIN {
            // SAFETY: an anonymous private mapping has no preconditions;
            // the kernel zero-fills it and aligns it to a page. Populated
            // at once: one call instead of a page fault per 4 KiB when a
            // writer first fills a folio.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                alloc::handle_alloc_error(Layout::from_size_align(len, IO_ALIGN).expect("layout"));
            }
            return AlignedBuf { ptr: p.cast(), len };
        }
        if len % IO_ALIGN == 0 {
            if let Some(p) = SMALL[len / IO_ALIGN].lock().pop() {
                let ptr = p as *mut u8;
                if zero {
                    // SAFETY: a freed buffer of exactly `len` bytes, ours now.
                    unsafe { std::ptr::write_bytes(ptr, 0, len) };
                }
                return AlignedBuf { ptr, len };
            }
        }
        let layout = Layout::from_size_align(len, IO_ALIGN).expect("buffer layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }
}

/// `len` bytes (a multiple of `HUGE_PAGE`) of zeroed memory at an
/// address aligned to `HUGE_PAGE`, advised to be huge pages (the kernel
/// decides: with THP off, or no huge page free, they are 4 KiB pages)
/// and populated at once. Unmapped as any mapped buffer (`Drop`). None if
/// the mapping fails.
fn map_huge(len: usize) -> Option<*mut u8> {
    let span = len + HUGE_PAGE;
    // SAFETY: an anonymous private mapping has no preconditions.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let addr = p as usize;
    let start = addr.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (start - addr, addr + span - (start + len));
    // SAFETY: the head and the tail are parts of the mapping just made,
    // outside [start, start + len), which is all that is kept.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
        let kept = start as *mut libc::c_void;
        // Advice only: refused, the memory is ordinary pages.
        libc::madvise(kept, len, libc::MADV_HUGEPAGE);
        // Populated now, as the other mapped buffers are (MAP_POPULATE
        // would populate before the advice). Refused (before Linux
        // 5.14), the pages fault in at first use.
        libc::madvise(kept, len, libc::MADV_POPULATE_WRITE);
    }
    Some(start as *mut u8)
}

impl AlignedBuf {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `r` alone, without borrowing the rest of the buffer: other
    /// threads may be reading other parts of it through raw pointers (a
    /// folio's blocks under writeback, see `fs::writeback`).
    pub fn range(&self, r: std::ops::Range<usize>) -> &[u8] {
        assert!(r.start <= r.end && r.end <= self.len, "buffer range");
        // SAFETY: in bounds, checked above; ptr is valid for len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.add(r.start), r.end - r.start) }
    }

    /// Bytes `r` alone, mutably (see `range`).
    pub fn range_mut(&mut self, r: std::ops::Range<usize>) -> &mut [u8] {
        assert!(r.start <= r.end && r.end <= self.len, "buffer range");
        // SAFETY: in bounds, checked above; uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start) }
    }

    /// The address of byte `at`, for I/O that outlives a borrow (the
    /// caller keeps the buffer alive and unchanged while it is used).
    pub fn ptr_at(&self, at: usize) -> *mut u8 {
        assert!(at <= self.len, "buffer offset");
        // SAFETY: in bounds (one past the end at most).
        unsafe { self.ptr.add(at) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len >= MMAP_MIN {
            // SAFETY: mapped in `zeroed` with this length, unmapped once.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        } else if self.len > 0 {
            if self.len % IO_ALIGN == 0 {
                let mut kept = SMALL[self.len / IO_ALIGN].lock();
                if kept.len() < SMALL_KEEP / self.len {
                    kept.push(self.ptr as usize);
                    return;
                }
            }
            let layout = Layout::from_size_align(self.len, IO_ALIGN).expect("buffer layout");
            // SAFETY: allocated in `zeroed` with the same layout.
            unsafe { alloc::dealloc(self.ptr, layout) };
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        AlignedBuf::copy_of(self)
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small buffer freed and taken again comes back zeroed from
    /// `zeroed`, aligned, and with the bytes copied by `clone`.
    #[test]
    fn reused_small_buffers_are_zeroed_and_aligned() {
        for len in [IO_ALIGN, 3 * IO_ALIGN, MMAP_MIN - IO_ALIGN] {
            let dirty: Vec<AlignedBuf> = (0..4)
                .map(|_| {
                    let mut b = AlignedBuf::zeroed(len);
                    b.fill(0xA5);
                    b
                })
                .collect();
            let copy = dirty[0].clone();
            assert!(copy.iter().all(|&x| x == 0xA5));
            assert_eq!(copy.as_ptr() as usize % IO_ALIGN, 0);
            drop(dirty);
            for _ in 0..4 {
                let b = AlignedBuf::zeroed(len);
                assert_eq!(b.as_ptr() as usize % IO_ALIGN, 0);
                assert!(b.iter().all(|&x| x == 0), "a reused {len}-byte buffer");
            }
        }
    }

    /// Buffers of whole huge pages start on one and come zeroed (that
    /// they are unmapped whole is tests/huge_pages.rs, alone in its
    /// process).
    #[test]
    fn huge_page_buffers_are_aligned_and_zeroed() {
        for len in [HUGE_PAGE, 3 * HUGE_PAGE] {
            for _ in 0..4 {
                let mut b = AlignedBuf::zeroed(len);
                assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0, "{len} bytes");
                assert!(b.iter().all(|&x| x == 0));
                b[len - 1] = 1;
            }
        }
    }
}

//! Large buffers used again. A chunk fetched or made and a large write's
//! copy each filled fresh memory before, which the kernel faults in and
//! zeroes page by page on first touch, and which the allocator hands
//! back to the kernel when it is freed, so the next one is faulted in
//! again: half the page faults of W4 on an object image, and a third of
//! the device's CPU (docs/BENCH.md, "buffers used again"). A buffer made
//! here goes back to the pool when the last view of it (`Bytes`) is
//! dropped, up to `KEPT` bytes in all in the process, and is freed once
//! it has waited `IDLE` unused: memory is kept only while it is being
//! used again.

use bytes::Bytes;
use futures::StreamExt;
use object_store::{path::Path, GetResultPayload, ObjectStore};
use parking_lot::Mutex;
use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

/// Smaller buffers come from the allocator, out of memory it holds.
const SMALLEST: usize = 256 << 10;
/// Capacities are rounded up to this, so that writes of nearby sizes
/// share buffers.
const STEP: usize = 64 << 10;
/// At most this much is kept free, in all. A flush for the bound frees
/// up to 64 MiB of write copies, and the chunks it makes push as many
/// out of the chunk cache; a cold read frees a chunk for each it fetches.
const KEPT: usize = 192 << 20;
/// A free buffer not used again within this is freed.
const IDLE: Duration = Duration::from_secs(2);

struct Free {
    /// Oldest first, each with when it was freed.
    bufs: Vec<(Vec<u8>, Instant)>,
    bytes: usize,
    /// A thread is freeing what waits `IDLE` (`trim`).
    trimming: bool,
}

static FREE: Mutex<Free> = Mutex::new(Free {
    bufs: Vec::new(),
    bytes: 0,
    trimming: false,
});

/// An empty buffer that holds at least `len` bytes: one freed before
/// if the pool has one of its size.
pub(crate) fn vec(len: usize) -> Vec<u8> {
    if len < SMALLEST {
        return Vec::with_capacity(len);
    }
    let cap = len.next_multiple_of(STEP);
    let mut f = FREE.lock();
    // The one freed last: its pages are the likeliest in the CPU's cache.
    match f.bufs.iter().rposition(|(v, _)| v.capacity() == cap) {
        Some(i) => {
            let (v, _) = f.bufs.remove(i);
            f.bytes -= cap;
            v
        }
        None => {
            drop(f);
            Vec::with_capacity(cap)
        }
    }
}

/// `v` (from `vec`) as shared bytes, which give it back to the pool
/// when the last view of them is dropped.
pub(crate) fn bytes(v: Vec<u8>) -> Bytes {
    if v.capacity() < SMALLEST {
        return Bytes::from(v);
    }
    Bytes::from_owner(Kept(v))
}

/// A copy of `data` in a buffer from the pool.
pub(crate) fn copy(data: &[u8]) -> Bytes {
    let mut v = vec(data.len());
    v.extend_from_slice(data);
    bytes(v)
}

/// The object at `key`, received into a buffer from the pool; `expect`
/// is its length if it is whole (what the store says is trusted no
/// further: the buffer grows past that only as bytes come).
pub(crate) async fn get(
    store: &dyn ObjectStore,
    key: &Path,
    expect: usize,
) -> object_store::Result<Bytes> {
    let r = store.get(key).await?;
    let (start, len) = (r.range.start, r.range.end - r.range.start);
    let mut v = vec(usize::try_from(len).unwrap_or(expect).min(expect));
    match r.payload {
        // A directory store's file, read whole as `GetResult::bytes`
        // does (its stream reads a piece at a time).
        GetResultPayload::File(mut file, path) => {
            let read = tokio::task::spawn_blocking(move || {
                file.seek(SeekFrom::Start(start))?;
                file.take(len).read_to_end(&mut v)?;
                Ok::<_, std::io::Error>(v)
            });
            match read.await {
                Ok(Ok(v)) => Ok(bytes(v)),
                Ok(Err(e)) => Err(object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: format!("{path:?}: {e}").into(),
                }),
                Err(e) => Err(object_store::Error::JoinError { source: e }),
            }
        }
        GetResultPayload::Stream(mut body) => {
            while let Some(piece) = body.next().await {
                v.extend_from_slice(&piece?);
            }
            Ok(bytes(v))
        }
    }
}

/// Bytes free in the pool now.
#[cfg(test)]
fn free_bytes() -> usize {
    FREE.lock().bytes
}

struct Kept(Vec<u8>);

impl AsRef<[u8]> for Kept {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.0);
        let cap = v.capacity();
        // Only the sizes `vec` makes: another is never asked for.
        if cap % STEP != 0 {
            return;
        }
        v.clear();
        let mut f = FREE.lock();
        if f.bytes + cap > KEPT {
            return;
        }
        f.bytes += cap;
        f.bufs.push((v, Instant::now()));
        if !f.trimming {
            f.trimming = std::thread::Builder::new()
                .name("foliofs-pool".into())
                .spawn(trim)
                .is_ok();
        }
    }
}

/// Free the buffers that waited `IDLE`, until none is left.
fn trim() {
    loop {
        std::thread::sleep(IDLE / 2);
        let mut f = FREE.lock();
        let old = f
            .bufs
            .iter()
            .take_while(|(_, at)| at.elapsed() >= IDLE)
            .count();
        let freed: Vec<_> = f.bufs.drain(..old).collect();
        f.bytes -= freed.iter().map(|(v, _)| v.capacity()).sum::<usize>();
        if f.bufs.is_empty() {
            f.trimming = false;
        }
        let last = !f.trimming;
        drop(f);
        drop(freed);
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_dropped_is_used_again_and_the_pool_is_bounded() {
        // A size no other test's buffers have.
        let len = (3 << 20) + 12345;
        let first = copy(&vec![7u8; len]);
        let at = first.as_ptr();
        let view = first.slice(4096..8192);
        drop(first);
        // A view keeps the buffer out of the pool.
        let other = vec(len);
        assert_ne!(other.as_ptr(), at);
        drop(other);
        drop(view);
        let again = vec(len);
        assert_eq!(again.as_ptr(), at, "the buffer freed last is used again");
        assert!(again.is_empty() && again.capacity() >= len);
        drop(again);
        // Never more than KEPT free, however much is dropped at once.
        let many: Vec<Bytes> = (0..2 * KEPT / len).map(|_| bytes(vec(len))).collect();
        drop(many);
        assert!(free_bytes() <= KEPT, "{} kept", free_bytes());
        // Small buffers are the allocator's.
        assert!(vec(4096).capacity() < SMALLEST);
        // What waits unused is freed.
        drop(bytes(vec(len)));
        let deadline = Instant::now() + 5 * IDLE;
        while FREE
            .lock()
            .bufs
            .iter()
            .any(|(v, _)| v.capacity() == len.next_multiple_of(STEP))
        {
            assert!(Instant::now() < deadline, "an idle buffer was not freed");
            std::thread::sleep(IDLE / 4);
        }
    }
}

//! Direct I/O: alignment, checksums, holes, request sizes, coherence with
//! the buffered path, and many threads racing on one file against a model.

use foliofs::device::{AlignedBuf, MemDevice};
use foliofs::fs::*;
use foliofs::{Error, Fs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod common;
use common::{Hooked, Hooks};

const BS: usize = 4096;

fn fresh(bytes: u64, opts: MountOptions) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(bytes));
    mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    let fs = Fs::mount(dev.clone(), opts).unwrap();
    (dev, fs)
}

fn pattern(len: usize, seed: u64) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len);
    let mut x = seed | 1;
    for byte in b.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = x as u8;
    }
    b
}

#[test]
fn round_trip_overwrite_and_alignment() {
    let (dev, fs) = fresh(64 << 20, MountOptions::default());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    let data = pattern(1 << 20, 1);
    assert_eq!(fs.write_direct(f, 0, &data).unwrap(), 1 << 20);
    assert_eq!(fs.counters().dio_writes_exclusive, 1, "extending write");
    let mut back = AlignedBuf::zeroed(1 << 20);
    assert_eq!(fs.read_direct(f, 0, &mut back).unwrap(), 1 << 20);
    assert_eq!(&back[..], &data[..]);

    // An overwrite inside the file takes the shared lock.
    let over = pattern(8 * BS, 2);
    fs.write_direct(f, 16 * BS as u64, &over).unwrap();
    assert_eq!(fs.counters().dio_overwrites_shared, 1);
    let mut buffered = vec![0u8; 8 * BS];
    fs.read(f, 16 * BS as u64, &mut buffered).unwrap();
    assert_eq!(&buffered[..], &over[..]);

    // Unaligned offset, length or buffer: EINVAL, nothing written.
    let odd = AlignedBuf::zeroed(2 * BS);
    for r in [
        fs.write_direct(f, 100, &odd[..BS]),
        fs.write_direct(f, 0, &odd[..BS - 1]),
        fs.write_direct(f, 0, &odd[1..BS + 1]),
        fs.read_direct(f, 0, &mut AlignedBuf::zeroed(2 * BS)[1..BS + 1]),
    ] {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        assert_eq!(e.errno(), libc::EINVAL);
    }
    fs.read(f, 0, &mut buffered).unwrap();
    assert_eq!(&buffered[..], &data[..8 * BS]);

    // Short read at end of file; bytes past it come back zero.
    fs.setattr(
        f,
        &SetAttr {
            size: Some((1 << 20) - 100),
            ..Default::default()
        },
    )
    .unwrap();
    let mut tail = AlignedBuf::zeroed(4 * BS);
    let n = fs
        .read_direct(f, (1 << 20) - 2 * BS as u64, &mut tail)
        .unwrap();
    assert_eq!(n, 2 * BS - 100);
    assert_eq!(&tail[..n], &data[(1 << 20) - 2 * BS..(1 << 20) - 100]);
    assert!(tail[n..].iter().all(|&b| b == 0));

    // Survives a remount with checksums intact.
    fs.unmount().unwrap();
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    let mut again = AlignedBuf::zeroed(16 * BS);
    fs.read_direct(f, 16 * BS as u64, &mut again).unwrap();
    assert_eq!(&again[..8 * BS], &over[..]);
    assert_eq!(fs.counters().csum_failures, 0);
}

#[test]
fn holes_and_unwritten_read_zeros_without_device_io() {
    let (_dev, fs) = fresh(64 << 20, MountOptions::default());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(f, Falloc::Allocate { keep_size: false }, 0, 64 * BS as u64)
        .unwrap();
    fs.setattr(
        f,
        &SetAttr {
            size: Some(128 * BS as u64),
            ..Default::default()
        },
    )
    .unwrap();
    let before = fs.counters().dio_read_requests;
    let mut b = pattern(128 * BS, 9);
    assert_eq!(fs.read_direct(f, 0, &mut b).unwrap(), 128 * BS);
    assert!(b.iter().all(|&x| x == 0));
    assert_eq!(fs.counters().dio_read_requests, before);
    // A direct write into the unwritten range converts it.
    let w = pattern(4 * BS, 3);
    fs.write_direct(f, 8 * BS as u64, &w).unwrap();
    fs.read_direct(f, 0, &mut b).unwrap();
    assert_eq!(&b[8 * BS..12 * BS], &w[..]);
    assert!(b[..8 * BS].iter().all(|&x| x == 0));
    let ext = fs.extents(f).unwrap();
    assert!(ext.iter().any(|e| !e.unwritten && e.blocks == 4));
}

#[test]
fn request_cap_splits_reads() {
    let (_dev, fs) = fresh(64 << 20, MountOptions::default());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    let data = pattern(4 << 20, 4);
    fs.write_direct(f, 0, &data).unwrap();
    let mut b = AlignedBuf::zeroed(1 << 20);
    for (cap, want) in [(256u64, 1u64), (1, 256), (16, 16)] {
        fs.set_dio_max_blocks(cap);
        let c0 = fs.counters().dio_read_requests;
        fs.read_direct(f, 1 << 20, &mut b).unwrap();
        assert_eq!(&b[..], &data[1 << 20..2 << 20]);
        assert_eq!(fs.counters().dio_read_requests - c0, want, "cap {cap}");
    }
    let hist = fs.counters().dio_request_blocks;
    assert!(hist[0] >= 256 && hist[4] >= 16 && hist[8] >= 1, "{hist:?}");
}

#[test]
fn flipped_byte_is_eio_on_direct_and_buffered_reads() {
    let (dev, fs) = fresh(64 << 20, MountOptions::default());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    let data = pattern(16 * BS, 5);
    fs.write_direct(f, 0, &data).unwrap();
    fs.sync().unwrap();
    let e = fs.extents(f).unwrap();
    let victim = e[0].device_block + 3;
    dev.poke(victim * BS as u64 + 17, &[!data[3 * BS + 17]]);
    let mut b = AlignedBuf::zeroed(16 * BS);
    match fs.read_direct(f, 0, &mut b) {
        Err(Error::DataChecksum { ino, offset, addr }) => {
            assert_eq!((ino, offset, addr), (f, 3 * BS as u64, victim));
        }
        r => panic!("direct read gave {r:?}"),
    }
    let mut v = vec![0u8; 16 * BS];
    let e = fs.read(f, 0, &mut v).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert_eq!(fs.counters().csum_failures, 2);
    // Blocks before the bad one still read.
    fs.read_direct(f, 0, &mut b[..3 * BS]).unwrap();
    assert_eq!(&b[..3 * BS], &data[..3 * BS]);
}

#[test]
fn cached_data_is_written_back_before_direct_io() {
    let (_dev, fs) = fresh(64 << 20, MountOptions::default());
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &vec![7u8; 10 * BS + 5]).unwrap();
    let mut b = AlignedBuf::zeroed(12 * BS);
    assert_eq!(fs.read_direct(f, 0, &mut b).unwrap(), 10 * BS + 5);
    assert!(b[..10 * BS + 5].iter().all(|&x| x == 7));
    // Buffered partial write, then a direct write over it, then reads.
    fs.write(f, 3, b"abc").unwrap();
    let w = pattern(2 * BS, 6);
    fs.write_direct(f, 0, &w).unwrap();
    let mut v = vec![0u8; 2 * BS];
    fs.read(f, 0, &mut v).unwrap();
    assert_eq!(&v[..], &w[..]);
    // A direct write past EOF leaves zeros in the gap, also in the old
    // last block.
    fs.write_direct(f, 20 * BS as u64, &w).unwrap();
    let mut all = vec![0u8; 22 * BS];
    assert_eq!(fs.read(f, 0, &mut all).unwrap(), 22 * BS);
    assert!(all[10 * BS + 5..20 * BS].iter().all(|&x| x == 0));
    assert_eq!(&all[20 * BS..], &w[..]);
}

/// Block `b` at version `v`: the first 16 bytes say which, the rest is
/// derived from them, so a reader can check any block it sees.
fn fill_block(buf: &mut [u8], b: u64, v: u64) {
    buf[..8].copy_from_slice(&b.to_le_bytes());
    buf[8..16].copy_from_slice(&v.to_le_bytes());
    for (i, x) in buf[16..].iter_mut().enumerate() {
        *x = (b.wrapping_mul(31) ^ v.wrapping_mul(7) ^ i as u64) as u8;
    }
}

/// (block, version) of a block, or None for zeros; panics on anything else.
fn check_block(buf: &[u8], b: u64) -> Option<u64> {
    if buf.iter().all(|&x| x == 0) {
        return None;
    }
    let got_b = u64::from_le_bytes(buf[..8].try_into().unwrap());
    let v = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    assert_eq!(got_b, b, "block {b} holds block {got_b}'s data");
    let mut want = vec![0u8; buf.len()];
    fill_block(&mut want, b, v);
    assert!(buf == &want[..], "block {b} version {v} is torn or stale");
    Some(v)
}

#[test]
fn racing_threads_match_the_model() {
    let ops: u64 = std::env::var("FOLIOFS_DIO_RACE_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    // With read-ahead for direct readers: reader 0 reads sequentially,
    // so its reads are read ahead while the writers race them.
    let opts = MountOptions {
        direct_read_ahead: true,
        ..MountOptions::default()
    };
    let (_dev, fs) = fresh(128 << 20, opts);
    let fs = Arc::new(fs);
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    // Blocks 0..64 are owned by writer threads (block % 4 = writer), blocks
    // 64..72 are shared by all writers, 72..96 belong to the truncator.
    const OWNED: u64 = 64;
    const SHARED_END: u64 = 72;
    const END: u64 = 96;
    let mut init = AlignedBuf::zeroed(END as usize * BS);
    for b in 0..END {
        fill_block(&mut init[b as usize * BS..(b as usize + 1) * BS], b, 0);
    }
    fs.write_direct(f, 0, &init).unwrap();
    let model: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(vec![0; END as usize]));
    let version = Arc::new(AtomicU64::new(1));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for w in 0..4u64 {
        let (fs, model, version) = (fs.clone(), model.clone(), version.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = w * 7919 + 1;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut buf = AlignedBuf::zeroed(2 * BS);
            for _ in 0..ops {
                let r = next();
                let v = version.fetch_add(1, Ordering::SeqCst);
                if r % 5 == 0 {
                    // Contended block: any writer's version may win.
                    let b = OWNED + next() % (SHARED_END - OWNED);
                    fill_block(&mut buf[..BS], b, v);
                    fs.write_direct(f, b * BS as u64, &buf[..BS]).unwrap();
                    continue;
                }
                let b = (next() % (OWNED / 4)) * 4 + w;
                fill_block(&mut buf[..BS], b, v);
                if r % 3 == 0 {
                    fs.write(f, b * BS as u64, &buf[..BS]).unwrap();
                } else {
                    fs.write_direct(f, b * BS as u64, &buf[..BS]).unwrap();
                }
                model.lock().unwrap()[b as usize] = v;
            }
        }));
    }
    for rd in 0..3u64 {
        let (fs, model, version, stop) = (fs.clone(), model.clone(), version.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut buf = AlignedBuf::zeroed(END as usize * BS);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let floor = model.lock().unwrap().clone();
                let (start, n) = match rd {
                    0 => ((i * 8) % END, 8),
                    _ => ((i * 13) % 40, 8 + (i * 7) % 48),
                };
                let n = n.min(END - start);
                let len = (n as usize) * BS;
                let got = if rd == 0 || (i + rd) % 2 == 0 {
                    fs.read_direct(f, start * BS as u64, &mut buf[..len])
                } else {
                    fs.read(f, start * BS as u64, &mut buf[..len])
                }
                .unwrap_or_else(|e| panic!("read at block {start}: {e}"));
                let ceiling = version.load(Ordering::SeqCst);
                for k in 0..(got / BS) as u64 {
                    let b = start + k;
                    let blk = &buf[k as usize * BS..(k as usize + 1) * BS];
                    match check_block(blk, b) {
                        Some(v) => {
                            assert!(v < ceiling, "block {b}: version {v} never written");
                            if b < OWNED {
                                assert!(v >= floor[b as usize], "block {b}: went back");
                            }
                        }
                        None => assert!(b >= SHARED_END, "block {b} read as zeros"),
                    }
                }
                i += 1;
            }
        }));
    }
    {
        // Truncate the tail away and write it back, over and over.
        let (fs, model, stop) = (fs.clone(), model.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut buf = AlignedBuf::zeroed((END - SHARED_END) as usize * BS);
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let cut = SHARED_END + round % (END - SHARED_END);
                let size = |s: u64| SetAttr {
                    size: Some(s),
                    ..Default::default()
                };
                fs.setattr(f, &size(cut * BS as u64)).unwrap();
                fs.setattr(f, &size(END * BS as u64)).unwrap();
                let m = model.lock().unwrap();
                for b in cut..END {
                    let at = ((b - SHARED_END) as usize) * BS;
                    fill_block(&mut buf[at..at + BS], b, m[b as usize]);
                }
                let at = ((cut - SHARED_END) as usize) * BS;
                if round % 2 == 0 {
                    fs.write_direct(f, cut * BS as u64, &buf[at..]).unwrap();
                } else {
                    fs.write(f, cut * BS as u64, &buf[at..]).unwrap();
                }
                drop(m);
                round += 1;
            }
            assert!(round > 0);
        }));
    }
    let writers: Vec<_> = handles.drain(..4).collect();
    for h in writers {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    // Final contents equal the model; contended blocks hold some version.
    let mut buf = AlignedBuf::zeroed(END as usize * BS);
    fs.read_direct(f, 0, &mut buf).unwrap();
    let model = model.lock().unwrap();
    for b in 0..END {
        let v = check_block(&buf[b as usize * BS..(b as usize + 1) * BS], b);
        if !(OWNED..SHARED_END).contains(&b) {
            assert_eq!(v, Some(model[b as usize]), "block {b}");
        } else {
            assert!(v.is_some(), "contended block {b} lost");
        }
    }
    let c = fs.counters();
    assert_eq!(c.csum_failures, 0);
    assert!(c.dio_overwrites_shared > 0 && c.lock_exclusive > 0);
}

/// Writes that, once armed, wait at a gate until a second write arrives
/// (or `wait` passes), so two writers in the engine at once meet there.
struct Gate {
    armed: AtomicBool,
    inside: Mutex<usize>,
    cv: std::sync::Condvar,
    wait: std::time::Duration,
}

impl Hooks for Gate {
    fn write(
        &self,
        _len: usize,
        io: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if !self.armed.load(Ordering::SeqCst) {
            return io();
        }
        let mut n = self.inside.lock().unwrap();
        *n += 1;
        self.cv.notify_all();
        let deadline = std::time::Instant::now() + self.wait;
        while *n < 2 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            n = self.cv.wait_timeout(n, left).unwrap().0;
        }
        drop(n);
        let r = io();
        *self.inside.lock().unwrap() -= 1;
        r
    }
}

/// Direct overwrites of one file run side by side under the shared lock
/// (the counter of overwrites in progress at once goes above 1) and one
/// at a time with the exclusive-lock knob.
#[test]
fn overwrites_of_one_file_run_in_parallel_under_the_shared_lock() {
    for (lock, parallel) in [
        (DioLock::SharedOverwrite, true),
        (DioLock::Exclusive, false),
    ] {
        let dev = Arc::new(Hooked {
            mem: Arc::new(MemDevice::new(64 << 20)),
            hooks: Gate {
                armed: AtomicBool::new(false),
                inside: Mutex::new(0),
                cv: std::sync::Condvar::new(),
                wait: std::time::Duration::from_millis(50),
            },
        });
        mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
        let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
        let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
        fs.write_direct(f, 0, &pattern(64 * BS, 1)).unwrap();
        fs.fsync(f, false).unwrap();
        fs.set_dio_lock(lock);
        dev.armed.store(true, Ordering::SeqCst);
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    for k in 0..4u64 {
                        let b = t * 32 + k;
                        fs.write_direct(f, b * BS as u64, &pattern(BS, 10 + b))
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        dev.armed.store(false, Ordering::SeqCst);
        let c = fs.counters();
        if parallel {
            assert!(
                c.dio_overwrites_peak >= 2,
                "{lock:?}: peak {}",
                c.dio_overwrites_peak
            );
        } else {
            assert_eq!(c.dio_overwrites_peak, 1, "{lock:?}");
        }
        for t in 0..2u64 {
            for k in 0..4u64 {
                let b = t * 32 + k;
                let mut back = AlignedBuf::zeroed(BS);
                fs.read_direct(f, b * BS as u64, &mut back).unwrap();
                assert_eq!(&back[..], &pattern(BS, 10 + b)[..], "block {b}");
            }
        }
    }
}

/// O_APPEND, buffered and direct: each append lands at the size it found
/// under the inode's lock, so appends from several threads never overlap
/// and none is lost; an empty append reports the size; a direct append
/// to a size that is not whole blocks is EINVAL.
#[test]
fn appends_from_many_threads_never_overlap() {
    let (_dev, fs) = fresh(64 << 20, MountOptions::default());
    let root = fs.root_ino();
    let f = fs.create(root, b"log", 0o644, 0, 0).unwrap().ino;
    let d = fs.create(root, b"dlog", 0o644, 0, 0).unwrap().ino;
    const THREADS: u64 = 4;
    const EACH: u64 = 64;
    const REC: u64 = 80;
    let offsets = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (fs, offsets) = (&fs, &offsets);
            s.spawn(move || {
                for i in 0..EACH {
                    // Buffered records of 80 bytes, direct ones of a block,
                    // each marked with its writer and number.
                    let rec = format!("{t:02}:{i:04}|").repeat(10);
                    let (at, n) = fs.append(f, rec.as_bytes()).unwrap();
                    assert_eq!(n, REC as usize);
                    let mut blk = AlignedBuf::zeroed(BS);
                    blk[..8].copy_from_slice(&(t * 1000 + i).to_le_bytes());
                    let (dat, dn) = fs.append_direct(d, &blk).unwrap();
                    assert_eq!(dn, BS);
                    offsets.lock().unwrap().push((at, dat));
                }
            });
        }
    });
    let n = THREADS * EACH;
    let (mut at, mut dat): (Vec<u64>, Vec<u64>) = offsets.into_inner().unwrap().into_iter().unzip();
    at.sort_unstable();
    dat.sort_unstable();
    assert_eq!(at, (0..n).map(|k| k * REC).collect::<Vec<_>>());
    assert_eq!(dat, (0..n).map(|k| k * BS as u64).collect::<Vec<_>>());
    assert_eq!(fs.getattr(f).unwrap().size, n * REC);
    assert_eq!(fs.getattr(d).unwrap().size, n * BS as u64);
    // Every record whole, each writer's in its own order.
    let mut all = vec![0u8; (n * REC) as usize];
    fs.read(f, 0, &mut all).unwrap();
    let mut next = [0u64; THREADS as usize];
    for rec in all.chunks(REC as usize) {
        let s = std::str::from_utf8(&rec[..8]).unwrap();
        assert_eq!(rec, s.repeat(10).as_bytes(), "a torn record");
        let t: usize = s[..2].parse().unwrap();
        assert_eq!(s[3..7].parse::<u64>().unwrap(), next[t]);
        next[t] += 1;
    }
    let mut seen = std::collections::HashSet::new();
    let mut back = AlignedBuf::zeroed(BS);
    for k in 0..n {
        fs.read_direct(d, k * BS as u64, &mut back).unwrap();
        assert!(seen.insert(u64::from_le_bytes(back[..8].try_into().unwrap())));
    }
    assert_eq!(seen.len() as u64, n);

    // Empty appends: at the size, nothing written.
    assert_eq!(fs.append(f, b"").unwrap(), (n * REC, 0));
    assert_eq!(fs.append_direct(d, &[]).unwrap(), (n * BS as u64, 0));
    // Direct appends need a size of whole blocks.
    let (at, _) = fs.append(d, b"tail").unwrap();
    assert_eq!(at, n * BS as u64);
    let e = fs.append_direct(d, &AlignedBuf::zeroed(BS)).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert_eq!(fs.getattr(d).unwrap().size, n * BS as u64 + 4);
}

const MIB: usize = 1 << 20;

/// A fresh file system of `bytes` with read-ahead for direct readers
/// on, and a file holding `data`, written directly and synced.
fn read_ahead_file(bytes: u64, data: &[u8]) -> (Arc<MemDevice>, Fs, u64) {
    let opts = MountOptions {
        direct_read_ahead: true,
        ..MountOptions::default()
    };
    let (dev, fs) = fresh(bytes, opts);
    let f = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write_direct(f, 0, data).unwrap();
    fs.fsync(f, false).unwrap();
    (dev, fs, f)
}

/// Wait (up to 5 s) until `fs` has read at least `n` reads ahead, as a
/// caller through the mount spends its round trip between requests;
/// the count.
fn reads_ahead(fs: &Fs, n: u64) -> u64 {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let got = fs.counters().dio_ahead_reads;
        if got >= n || std::time::Instant::now() > until {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// With read-ahead for direct readers on, a sequential direct reader is
/// served from what was read ahead (counted), and never anything stale:
/// between two of its reads the next range is changed every way a file's
/// data changes (a direct overwrite, a buffered write, written back or
/// not, a hole punched, zeroed, truncated away and grown back), and each
/// read returns what the file holds, as a model says.
#[test]
fn direct_read_ahead_serves_sequential_readers_and_never_stale_data() {
    let (_dev, fs, f) = read_ahead_file(96 << 20, &pattern(24 * MIB, 7));
    let mut model = pattern(24 * MIB, 7).to_vec();
    let mut buf = AlignedBuf::zeroed(MIB);
    // Read chunk `i` and check it against the model.
    let read = |i: usize, buf: &mut AlignedBuf, model: &[u8]| {
        let n = fs.read_direct(f, (i * MIB) as u64, buf).unwrap();
        let want = &model[(i * MIB).min(model.len())..((i + 1) * MIB).min(model.len())];
        assert_eq!(n, want.len(), "chunk {i}: length");
        assert!(&buf[..n] == want, "chunk {i}: not what the file holds");
    };
    // Chunk 1 follows chunk 0: chunks 2 and 3 are read ahead; each read
    // after that reads one more ahead.
    for i in 0..4 {
        read(i, &mut buf, &model);
        if i > 0 {
            reads_ahead(&fs, i as u64 + 1);
        }
    }
    let hits = fs.counters().dio_ahead_hits;
    assert_eq!(hits, 2, "chunks 2 and 3 served from read-ahead");
    let at = |i: usize| (i * MIB) as u64;
    let mut i = 4;
    // Each change lands in chunk i + 1 after chunk i was read (so chunk
    // i + 1 was read ahead before it).
    type Change<'a> = Box<dyn Fn(&Fs, &mut Vec<u8>, usize) + 'a>;
    let changes: Vec<(&str, Change)> = vec![
        (
            "direct overwrite",
            Box::new(|fs, m, c| {
                let p = pattern(64 << 10, 11);
                fs.write_direct(f, at(c) + 4096, &p).unwrap();
                m[c * MIB + 4096..c * MIB + 4096 + p.len()].copy_from_slice(&p);
            }),
        ),
        (
            "buffered write, cached",
            Box::new(|fs, m, c| {
                fs.write(f, at(c) + 100, b"buffered").unwrap();
                m[c * MIB + 100..c * MIB + 108].copy_from_slice(b"buffered");
            }),
        ),
        (
            "buffered write, written back",
            Box::new(|fs, m, c| {
                fs.write(f, at(c) + 9000, b"written back").unwrap();
                fs.fsync(f, false).unwrap();
                m[c * MIB + 9000..c * MIB + 9012].copy_from_slice(b"written back");
            }),
        ),
        (
            "hole punched",
            Box::new(|fs, m, c| {
                fs.fallocate(f, Falloc::PunchHole, at(c), 256 << 10)
                    .unwrap();
                m[c * MIB..c * MIB + (256 << 10)].fill(0);
            }),
        ),
        (
            "range zeroed",
            Box::new(|fs, m, c| {
                let z = Falloc::ZeroRange { keep_size: true };
                fs.fallocate(f, z, at(c) + 8192, 8192).unwrap();
                m[c * MIB + 8192..c * MIB + 16384].fill(0);
            }),
        ),
        (
            "truncated and grown back",
            Box::new(|fs, m, c| {
                let size = |s: u64| SetAttr {
                    size: Some(s),
                    ..SetAttr::default()
                };
                fs.setattr(f, &size(at(c) + 512)).unwrap();
                fs.setattr(f, &size(m.len() as u64)).unwrap();
                m[c * MIB + 512..].fill(0);
            }),
        ),
    ];
    for (what, change) in &changes {
        let before = fs.counters().dio_ahead_reads;
        read(i, &mut buf, &model);
        assert!(
            reads_ahead(&fs, before + 1) > before,
            "{what}: nothing was read ahead"
        );
        change(&fs, &mut model, i + 1);
        i += 1;
        read(i, &mut buf, &model);
        i += 1;
    }
    // The end of the file: a short last read, and nothing past it.
    fs.setattr(
        f,
        &SetAttr {
            size: Some(at(i + 1) + 5000),
            ..SetAttr::default()
        },
    )
    .unwrap();
    model.resize(i * MIB + MIB + 5000, 0);
    read(i, &mut buf, &model);
    read(i + 1, &mut buf, &model);
    assert_eq!(fs.read_direct(f, at(i + 2), &mut buf).unwrap(), 0);
    assert_eq!(fs.counters().csum_failures, 0);
    fs.unmount().unwrap();
}

/// A block that went bad on the device before it was read ahead is
/// caught when the reader takes the read ahead (the reader checks it):
/// the read is EIO naming the block, counted once, and the reads around
/// it still come from read-ahead.
#[test]
fn a_bad_block_read_ahead_is_eio_for_its_reader() {
    let data = pattern(8 * MIB, 9);
    let (dev, fs, f) = read_ahead_file(64 << 20, &data);
    let mut buf = AlignedBuf::zeroed(MIB);
    for i in 0..2 {
        fs.read_direct(f, (i * MIB) as u64, &mut buf).unwrap();
    }
    reads_ahead(&fs, 2);
    // Chunks 2 and 3 are read ahead; chunk 4 will be once chunk 2 is
    // read. Spoil a block of it first.
    let lblk = (4 * MIB + 5 * BS) as u64 / BS as u64;
    let victim = fs.block_at(f, lblk * BS as u64).unwrap().unwrap();
    let at = 4 * MIB + 5 * BS + 99;
    dev.poke(victim * BS as u64 + 99, &[!data[at]]);
    for i in 2..4 {
        fs.read_direct(f, (i * MIB) as u64, &mut buf).unwrap();
        assert!(buf[..] == data[i * MIB..(i + 1) * MIB], "chunk {i}");
        reads_ahead(&fs, i as u64 + 1);
    }
    let before = fs.counters();
    match fs.read_direct(f, (4 * MIB) as u64, &mut buf) {
        Err(Error::DataChecksum { ino, offset, addr }) => {
            assert_eq!((ino, offset, addr), (f, lblk * BS as u64, victim));
        }
        r => panic!("the read of the spoiled chunk gave {r:?}"),
    }
    let c = fs.counters();
    // Chunks 2 and 3 served ahead; chunks 2 to 5 read ahead by then.
    assert_eq!(c.dio_ahead_hits, 2, "reads served ahead");
    assert!(
        before.dio_ahead_reads >= 3,
        "the spoiled chunk was not read ahead"
    );
    assert_eq!(c.csum_failures, 1, "one bad read, counted once");
}

//! W3 (seeds/ext4-shared-dio-lock.txt): 4 KiB direct random reads and
//! overwrites from several threads, the shared inode lock for overwrites
//! against exclusive.

use super::args::BenchArgs;
use super::engine::{file_ranges, fresh_fs, open_raw_if};
use super::report::{fill, make_file, plural, progress, ratio, run_threads, Outcome, Series};
use super::target::{w3_file, w3_pass};
use anyhow::{bail, Result};
use foliofs::device::AlignedBuf;
use foliofs::fs::CounterSnapshot;
use foliofs::DioLock;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One way of running W3.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Engine {
        lock: DioLock,
        log: bool,
    },
    Raw,
    /// The same pattern through system calls on `--vs DIR`.
    Kernel,
}

/// W3: threads of 4 KiB direct random reads and overwrites, 50/50,
/// synchronous; shared-overwrite lock vs exclusive, the overwrite log on
/// and off, the raw file, and a kernel file system (`--vs`).
pub fn w3(args: &BenchArgs) -> Result<Outcome> {
    let shared = DioLock::SharedOverwrite;
    let mut variants: Vec<(String, Variant)> = vec![
        (
            "shared overwrite".into(),
            Variant::Engine {
                lock: shared,
                log: true,
            },
        ),
        (
            "exclusive".into(),
            Variant::Engine {
                lock: DioLock::Exclusive,
                log: true,
            },
        ),
        (
            "shared overwrite, overwrite log off".into(),
            Variant::Engine {
                lock: shared,
                log: false,
            },
        ),
    ];
    if args.raw {
        variants.push(("raw O_DIRECT".into(), Variant::Raw));
    }
    let vs = args.vs_dir()?;
    if let Some((dir, name)) = &vs {
        w3_file(dir, args.file_mib)?;
        variants.push((name.clone(), Variant::Kernel));
    }
    let nv = variants.len();
    let pb = progress((args.rounds * nv * args.threads.len()) as u64);
    let (dev, fs) = fresh_fs(args)?;
    let ino = make_file(&fs, "w3", args.file_mib, &pb)?;
    let fs = Arc::new(fs);
    let bs = fs.block_size();
    let blocks = (args.file_mib << 20) / bs;
    // Device address of every file block, for the raw pattern.
    let mut map = Vec::with_capacity(blocks as usize);
    for (off, len) in file_ranges(&fs, ino)? {
        map.extend((0..len / bs).map(|k| off + k * bs));
    }
    let map = Arc::new(map);
    let raw = Arc::new(open_raw_if(args)?);
    let extents_before = fs.extents(ino)?.len();
    let mut series = Vec::new();
    let mut ratios = Vec::new();
    let c0 = fs.counters();
    for &threads in &args.threads {
        let mut values = vec![Vec::new(); nv];
        for round in 0..args.rounds {
            for k in 0..nv {
                let v = (k + round) % nv;
                pb.set_message(format!("W3 {threads}t {}", variants[v].0));
                // Not the last pass's background work (see W1).
                dev.settle()?;
                let ops = match variants[v].1 {
                    Variant::Kernel => {
                        let dir = &vs.as_ref().expect("a --vs directory").0;
                        w3_pass(args, dir, threads)?
                    }
                    kind => {
                        if let Variant::Engine { lock, log } = kind {
                            fs.set_dio_lock(lock);
                            fs.set_overwrite_log(log)?;
                        }
                        let raw_pass = kind == Variant::Raw;
                        run_threads(threads, args.seconds, |t, stop, count| {
                            let (fs, raw, map) = (fs.clone(), raw.clone(), map.clone());
                            move || -> Result<()> {
                                let raw = raw.as_ref().as_ref().filter(|_| raw_pass);
                                let mut rng = 0x9E37_79B9u64 ^ ((t as u64 + 1) * 0x1000_0001);
                                let mut buf = AlignedBuf::zeroed(bs as usize);
                                while !stop.load(Ordering::Relaxed) {
                                    rng ^= rng << 13;
                                    rng ^= rng >> 7;
                                    rng ^= rng << 17;
                                    let b = (rng >> 1) % blocks;
                                    let write = rng & 1 == 1;
                                    if write {
                                        fill(&mut buf, b, bs as usize);
                                    }
                                    match (raw, write) {
                                        (Some(raw), false) => {
                                            raw.read_exact_at(&mut buf, map[b as usize])?
                                        }
                                        (Some(raw), true) => {
                                            raw.write_all_at(&buf, map[b as usize])?
                                        }
                                        (None, false) => {
                                            fs.read_direct(ino, b * bs, &mut buf)?;
                                        }
                                        (None, true) => {
                                            fs.write_direct(ino, b * bs, &buf)?;
                                        }
                                    }
                                    count.fetch_add(1, Ordering::Relaxed);
                                }
                                Ok(())
                            }
                        })?
                    }
                };
                values[v].push(ops);
                pb.inc(1);
            }
        }
        for ((n, _), vals) in variants.iter().zip(&values) {
            series.push(Series {
                name: format!("{}, {n}", plural(threads, "thread")),
                unit: "IOPS".into(),
                values: vals.clone(),
            });
        }
        let t = plural(threads, "thread");
        ratios.push(ratio(
            &format!("{t}: shared / exclusive"),
            &values[0],
            &values[1],
            if threads >= 8 {
                "up to +140% at 24 threads; target >= 1.5 at 8"
            } else {
                "up to +140% at 24 threads"
            },
        ));
        ratios.push(ratio(
            &format!("{t}: overwrite log on / off"),
            &values[0],
            &values[2],
            "",
        ));
        if args.raw {
            ratios.push(ratio(
                &format!("{t}: shared / raw device"),
                &values[0],
                &values[3],
                "",
            ));
        }
        if let Some((_, name)) = &vs {
            ratios.push(ratio(
                &format!("{t}: engine / {name}"),
                &values[0],
                &values[nv - 1],
                if threads >= 8 { "target >= 1.0" } else { "" },
            ));
        }
    }
    pb.finish_and_clear();
    fs.set_overwrite_log(true)?;
    let c = fs.counters();
    if c.csum_failures != 0 {
        bail!("{} checksum failures during W3", c.csum_failures);
    }
    let extents_after = fs.extents(ino)?.len();
    let d = |f: fn(&CounterSnapshot) -> u64| f(&c) - f(&c0);
    let notes = vec![
        format!(
            "lock waits: shared {} ({:.1} ms), exclusive {} ({:.1} ms)",
            d(|c| c.lock_shared_waits),
            d(|c| c.lock_shared_wait_ns) as f64 / 1e6,
            d(|c| c.lock_exclusive_waits),
            d(|c| c.lock_exclusive_wait_ns) as f64 / 1e6,
        ),
        format!(
            "journal commits {} ({} without a flush) for {} direct overwrites; {} checkpoints, {} of them stalls",
            d(|c| c.journal.commits),
            d(|c| c.journal.commits_unflushed),
            d(|c| c.dio_overwrites_shared + c.dio_writes_exclusive),
            d(|c| c.journal.checkpoints),
            d(|c| c.journal.checkpoint_stalls),
        ),
        format!(
            "overwrite log: {} MiB logged, {} MiB out of place; journal {} MiB written ({} checksum blocks left to replay to derive), {} logged blocks written home in {} writes",
            d(|c| c.overwrite_logged_bytes) >> 20,
            d(|c| c.overwrite_cow_bytes) >> 20,
            (d(|c| c.journal.blocks_logged) * bs) >> 20,
            d(|c| c.journal.csum_blocks_implied),
            d(|c| c.journal.data_home_blocks),
            d(|c| c.journal.data_home_writes),
        ),
        format!("extents of the file before W3 {extents_before}, after {extents_after}"),
    ];
    match Arc::try_unwrap(fs) {
        Ok(fs) => fs.unmount()?,
        Err(_) => bail!("file system still in use after W3"),
    }
    Ok(Outcome {
        id: "W3".into(),
        title: format!(
            "4 KiB direct random read/overwrite 50/50, synchronous, {} MiB file",
            args.file_mib
        ),
        series,
        ratios,
        notes,
    })
}

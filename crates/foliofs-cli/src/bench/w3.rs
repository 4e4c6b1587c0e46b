//! W3 (seeds/ext4-shared-dio-lock.txt): 4 KiB direct random reads and
//! overwrites from several threads, the shared inode lock for overwrites
//! against exclusive.

use super::args::BenchArgs;
use super::engine::{file_ranges, fresh_fs, make_file, open_raw};
use super::report::{fill, plural, progress, ratio, run_threads, Outcome, Series};
use anyhow::{bail, Result};
use foliofs::device::AlignedBuf;
use foliofs::DioLock;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// W3: threads of 4 KiB direct random reads and overwrites, 50/50,
/// synchronous; shared-overwrite lock vs exclusive, and the raw file.
pub fn w3(args: &BenchArgs) -> Result<Outcome> {
    let mut variants = vec!["shared overwrite", "exclusive"];
    if args.raw {
        variants.push("raw O_DIRECT");
    }
    let pb = progress((args.rounds * variants.len() * args.threads.len()) as u64);
    let (_dev, fs) = fresh_fs(args)?;
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
    let raw = Arc::new(open_raw(args)?);
    let mut series = Vec::new();
    let mut ratios = Vec::new();
    let c0 = fs.counters();
    for &threads in &args.threads {
        let mut values = vec![Vec::new(); variants.len()];
        for round in 0..args.rounds {
            for k in 0..variants.len() {
                let v = (k + round) % variants.len();
                pb.set_message(format!("W3 {threads}t {}", variants[v]));
                fs.set_dio_lock(if v == 1 {
                    DioLock::Exclusive
                } else {
                    DioLock::SharedOverwrite
                });
                let ops = run_threads(threads, args.seconds, |t, stop, count| {
                    let (fs, raw, map) = (fs.clone(), raw.clone(), map.clone());
                    move || -> Result<()> {
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
                            match (v, write) {
                                (2, false) => raw.read_exact_at(&mut buf, map[b as usize])?,
                                (2, true) => raw.write_all_at(&buf, map[b as usize])?,
                                (_, false) => {
                                    fs.read_direct(ino, b * bs, &mut buf)?;
                                }
                                (_, true) => {
                                    fs.write_direct(ino, b * bs, &buf)?;
                                }
                            }
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(())
                    }
                })?;
                values[v].push(ops);
                pb.inc(1);
            }
        }
        for (n, vals) in variants.iter().zip(&values) {
            series.push(Series {
                name: format!("{}, {n}", plural(threads, "thread")),
                unit: "IOPS".into(),
                values: vals.clone(),
            });
        }
        ratios.push(ratio(
            &format!("{}: shared / exclusive", plural(threads, "thread")),
            &values[0],
            &values[1],
            if threads >= 8 {
                "up to +140% at 24 threads; target >= 1.5 at 8"
            } else {
                "up to +140% at 24 threads"
            },
        ));
        if args.raw {
            ratios.push(ratio(
                &format!("{}: shared / raw device", plural(threads, "thread")),
                &values[0],
                &values[2],
                "",
            ));
        }
    }
    pb.finish_and_clear();
    let c = fs.counters();
    if c.csum_failures != 0 {
        bail!("{} checksum failures during W3", c.csum_failures);
    }
    let notes = vec![
        format!(
            "lock waits: shared {} ({:.1} ms), exclusive {} ({:.1} ms)",
            c.lock_shared_waits - c0.lock_shared_waits,
            (c.lock_shared_wait_ns - c0.lock_shared_wait_ns) as f64 / 1e6,
            c.lock_exclusive_waits - c0.lock_exclusive_waits,
            (c.lock_exclusive_wait_ns - c0.lock_exclusive_wait_ns) as f64 / 1e6,
        ),
        format!(
            "journal commits {} for {} direct overwrites (group commit)",
            c.journal.commits - c0.journal.commits,
            (c.dio_overwrites_shared + c.dio_writes_exclusive)
                - (c0.dio_overwrites_shared + c0.dio_writes_exclusive),
        ),
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

//! W1 (seeds/iomap-per-block-dirty.txt): random 4 KiB overwrites of
//! cached files + fdatasync, per-block dirty tracking against whole-folio
//! dirtying, and the raw device's own 4 KiB write + fdatasync.

use super::args::BenchArgs;
use super::engine::{file_ranges, fresh_fs, open_raw, raw_write_at};
use super::report::{fill, make_file, progress, ratio, run_threads, Outcome, Series};
use super::target::{w1_files, w1_pass};
use anyhow::{bail, Result};
use foliofs::device::AlignedBuf;
use foliofs::fs::CounterSnapshot;
use foliofs::{Fs, MountOptions};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One way of running W1.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    /// The engine: per-block or whole-folio dirty tracking (64 KiB
    /// folios), overwrite log on or off.
    Engine { whole_folio: bool, log: bool },
    /// The raw image file: each write `unit` bytes with O_DIRECT.
    Raw { unit: u64 },
    /// The same pattern through system calls on `--vs DIR`.
    Kernel,
}

/// W1: two jobs, each a file written and read into the cache (large
/// folios), then random 4 KiB buffered overwrites, each followed by
/// fdatasync. Per-block dirty tracking vs whole-folio dirty tracking at
/// 64 KiB folios (remounted with the knob for each pass); the overwrite
/// log against the scheme before it; the raw device; a kernel file
/// system (`--vs`).
pub fn w1(args: &BenchArgs) -> Result<Outcome> {
    let jobs = 2usize;
    let mib = (args.file_mib / 4).max(1);
    let bs = 4096u64;
    let mut variants: Vec<(String, Variant)> = vec![
        (
            "per-block dirty".into(),
            Variant::Engine {
                whole_folio: false,
                log: true,
            },
        ),
        (
            "whole-folio dirty, 64 KiB folios".into(),
            Variant::Engine {
                whole_folio: true,
                log: true,
            },
        ),
        (
            "per-block dirty, overwrite log off".into(),
            Variant::Engine {
                whole_folio: false,
                log: false,
            },
        ),
    ];
    if args.raw {
        // The device's own price for the bytes: the same random blocks
        // written with O_DIRECT, 4 KiB or the whole 64 KiB around them,
        // each followed by fdatasync (rated in 4 KiB app writes).
        variants.push((
            "raw O_DIRECT, 4 KiB + fdatasync".into(),
            Variant::Raw { unit: bs },
        ));
        variants.push((
            "raw O_DIRECT, 64 KiB + fdatasync".into(),
            Variant::Raw { unit: 16 * bs },
        ));
    }
    let vs = args.vs_dir()?;
    if let Some((dir, name)) = &vs {
        w1_files(dir, jobs, mib)?;
        variants.push((name.clone(), Variant::Kernel));
    }
    let nv = variants.len();
    let pb = progress((args.rounds * nv) as u64);
    let (dev, fs) = fresh_fs(args)?;
    let mut inos = Vec::new();
    let mut ranges = Vec::new();
    for j in 0..jobs {
        let ino = make_file(&fs, &format!("w1-{j}"), mib, &pb)?;
        ranges.push(Arc::new(file_ranges(&fs, ino)?));
        inos.push(ino);
    }
    fs.unmount()?;
    let mut mibs = vec![Vec::new(); nv];
    // Engine variants: device bytes / app bytes, and flushes per fdatasync.
    let mut amp = vec![Vec::new(); nv];
    let mut flushes = vec![Vec::new(); nv];
    let mut largest = vec![0u64; nv];
    // Every pass writes the same random blocks for the same seed.
    let blocks = (mib << 20) / bs;
    let next_block = move |rng: &mut u64| {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng % blocks
    };
    for round in 0..args.rounds {
        for k in 0..nv {
            let v = (k + round) % nv;
            pb.set_message(format!("W1 {}", variants[v].0));
            // What the last pass left the device to do in the background
            // (an object image's shipping and folding: the whole-folio
            // pass writes 16 times the bytes) is not this pass's.
            dev.settle()?;
            let (whole_folio, log) = match variants[v].1 {
                Variant::Engine { whole_folio, log } => (whole_folio, log),
                Variant::Raw { unit } => {
                    // Unmounted: block b always holds fill(b), so writing
                    // it again leaves the file system as it was.
                    let ops = run_threads(jobs, args.seconds, |t, stop, count| {
                        let ranges = ranges[t].clone();
                        let raw = open_raw(args);
                        move || -> Result<()> {
                            let raw = raw?;
                            let mut rng = 0x2545_F491u64 ^ ((t as u64 + 7) * 0x9E37);
                            let mut buf = AlignedBuf::zeroed(unit as usize);
                            while !stop.load(Ordering::Relaxed) {
                                let b = next_block(&mut rng) / (unit / bs) * (unit / bs);
                                fill(&mut buf, b, bs as usize);
                                raw_write_at(&raw, &ranges, b * bs, &buf)?;
                                raw.sync_data()?;
                                count.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(())
                        }
                    })?;
                    mibs[v].push(ops * bs as f64 / (1 << 20) as f64);
                    pb.inc(1);
                    continue;
                }
                Variant::Kernel => {
                    let dir = &vs.as_ref().expect("a --vs directory").0;
                    let ops = w1_pass(args, dir, jobs, mib)?;
                    mibs[v].push(ops * bs as f64 / (1 << 20) as f64);
                    pb.inc(1);
                    continue;
                }
            };
            let mut o = MountOptions::default();
            if whole_folio {
                o.whole_folio_dirty = true;
                o.fixed_folio_bytes = Some(64 << 10);
            }
            o.overwrite_log = log;
            let fs = Arc::new(Fs::mount(dev.clone(), o)?);
            // pre_read: every file into the cache.
            let mut buf = vec![0u8; 1 << 20];
            for &ino in &inos {
                for m in 0..mib {
                    fs.read(ino, m << 20, &mut buf)?;
                }
            }
            largest[v] = largest[v].max(fs.cache_stats().largest_folio_bytes);
            let c0 = fs.counters();
            let ops = run_threads(jobs, args.seconds, |t, stop, count| {
                let (fs, ino) = (fs.clone(), inos[t]);
                move || -> Result<()> {
                    let mut rng = 0x2545_F491u64 ^ ((t as u64 + 7) * 0x9E37);
                    let mut buf = vec![0u8; bs as usize];
                    while !stop.load(Ordering::Relaxed) {
                        let b = next_block(&mut rng);
                        fill(&mut buf, b, bs as usize);
                        fs.write(ino, b * bs, &buf)?;
                        fs.fsync(ino, true)?;
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                }
            })?;
            let c = fs.counters();
            let app = (c.bytes_written_app - c0.bytes_written_app).max(1);
            amp[v].push(device_bytes(&c0, &c, bs) as f64 / app as f64);
            let syncs = (c.fsyncs - c0.fsyncs).max(1);
            flushes[v].push(all_flushes(&c0, &c) as f64 / syncs as f64);
            mibs[v].push(ops * bs as f64 / (1 << 20) as f64);
            match Arc::try_unwrap(fs) {
                Ok(fs) => fs.unmount()?,
                Err(_) => bail!("file system still in use after W1"),
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let mut series = Vec::new();
    for (v, (name, kind)) in variants.iter().enumerate() {
        series.push(Series {
            name: name.clone(),
            unit: "MiB/s".into(),
            values: mibs[v].clone(),
        });
        if matches!(kind, Variant::Engine { .. }) {
            series.push(Series {
                name: format!("{name}: device bytes / app bytes (log + home + in place)"),
                unit: "ratio".into(),
                values: amp[v].clone(),
            });
            series.push(Series {
                name: format!("{name}: device flushes per fdatasync"),
                unit: "ratio".into(),
                values: flushes[v].clone(),
            });
        }
    }
    let mut ratios = vec![
        ratio(
            "per-block / whole-folio (MiB/s)",
            &mibs[0],
            &mibs[1],
            "28 -> 452 MB/s (16x)",
        ),
        ratio(
            "whole-folio / per-block (device bytes written)",
            &amp[1],
            &amp[0],
            "target >= 10",
        ),
        ratio("overwrite log on / off (MiB/s)", &mibs[0], &mibs[2], ""),
    ];
    if args.raw {
        ratios.push(ratio(
            "raw 4 KiB / raw 64 KiB per fdatasync (MiB/s)",
            &mibs[3],
            &mibs[4],
            "the device's price for 16x the bytes",
        ));
        ratios.push(ratio(
            "per-block / raw 4 KiB (MiB/s)",
            &mibs[0],
            &mibs[3],
            "target >= 0.8",
        ));
    }
    if let Some((_, name)) = &vs {
        ratios.push(ratio(
            &format!("engine / {name} (MiB/s)"),
            &mibs[0],
            &mibs[nv - 1],
            "target >= 1.0",
        ));
    }
    Ok(Outcome {
        id: "W1".into(),
        title: format!(
            "{jobs} jobs x {mib} MiB cached files, random 4 KiB buffered overwrites + fdatasync"
        ),
        series,
        ratios,
        notes: vec![format!(
            "largest folio after the pre-read: {} KiB per-block run, {} KiB whole-folio run",
            largest[0] >> 10,
            largest[1] >> 10
        )],
    })
}

/// Bytes the engine wrote to the device for data between two snapshots:
/// the journal (logged blocks with their metadata), logged blocks written
/// home by checkpoints, and writeback's in-place or out-of-place writes.
pub(super) fn device_bytes(c0: &CounterSnapshot, c: &CounterSnapshot, bs: u64) -> u64 {
    let log = (c.journal.blocks_logged - c0.journal.blocks_logged) * bs;
    let home = (c.journal.data_home_blocks - c0.journal.data_home_blocks) * bs;
    log + home + (c.bytes_written_back - c0.bytes_written_back)
}

/// Device flushes the engine issued between two snapshots (journal,
/// checkpoints, data).
pub(super) fn all_flushes(c0: &CounterSnapshot, c: &CounterSnapshot) -> u64 {
    (c.journal.flushes - c0.journal.flushes) + (c.journal.data_flushes - c0.journal.data_flushes)
}

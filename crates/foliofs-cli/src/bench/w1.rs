//! W1 (seeds/iomap-per-block-dirty.txt): random 4 KiB overwrites of
//! cached files + fdatasync, per-block dirty tracking against whole-folio
//! dirtying, and the raw device's own 4 KiB write + fdatasync.

use super::args::BenchArgs;
use super::engine::{file_ranges, fresh_fs, make_file, open_raw, raw_write_at};
use super::report::{fill, progress, ratio, run_threads, variant_series, Outcome};
use anyhow::{bail, Result};
use foliofs::device::AlignedBuf;
use foliofs::{Fs, MountOptions};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// W1: two jobs, each a file written and read into the cache (large
/// folios), then random 4 KiB buffered overwrites, each followed by
/// fdatasync. Per-block dirty tracking vs whole-folio dirty tracking at
/// 64 KiB folios (remounted with the knob for each pass).
pub fn w1(args: &BenchArgs) -> Result<Outcome> {
    let jobs = 2usize;
    let mib = (args.file_mib / 4).max(1);
    let mut variants = vec!["per-block dirty", "whole-folio dirty, 64 KiB folios"];
    if args.raw {
        // The device's own price for the bytes: the same random blocks
        // written with O_DIRECT, 4 KiB or the whole 64 KiB around them,
        // each followed by fdatasync (rated in 4 KiB app writes).
        variants.push("raw O_DIRECT, 4 KiB + fdatasync");
        variants.push("raw O_DIRECT, 64 KiB + fdatasync");
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
    let bs = 4096u64;
    let mut mibs = vec![Vec::new(); nv];
    let mut amp = vec![Vec::new(); 2];
    let mut largest = [0u64; 2];
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
            pb.set_message(format!("W1 {}", variants[v]));
            if v >= 2 {
                // Unmounted: block b always holds fill(b), so writing
                // it again leaves the file system as it was.
                let unit = if v == 2 { bs } else { 16 * bs };
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
            let mut o = MountOptions::default();
            if v == 1 {
                o.whole_folio_dirty = true;
                o.fixed_folio_bytes = Some(64 << 10);
            }
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
            amp[v].push((c.bytes_written_back - c0.bytes_written_back) as f64 / app as f64);
            mibs[v].push(ops * bs as f64 / (1 << 20) as f64);
            match Arc::try_unwrap(fs) {
                Ok(fs) => fs.unmount()?,
                Err(_) => bail!("file system still in use after W1"),
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let mut series = variant_series(
        &variants[..2],
        &[
            ("", "MiB/s", &mibs),
            ("device bytes / app bytes", "ratio", &amp),
        ],
    );
    for v in 2..nv {
        series.extend(variant_series(
            &variants[v..v + 1],
            &[("", "MiB/s", &mibs[v..v + 1])],
        ));
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
    ];
    if args.raw {
        ratios.push(ratio(
            "raw 4 KiB / raw 64 KiB per fdatasync (MiB/s)",
            &mibs[2],
            &mibs[3],
            "the device's price for 16x the bytes",
        ));
        ratios.push(ratio(
            "per-block / raw 4 KiB (MiB/s)",
            &mibs[0],
            &mibs[2],
            "",
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

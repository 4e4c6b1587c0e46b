//! W4 (seeds/parallel-writeback.txt): several writers streaming buffered
//! writes into directories in different AGs, writeback contexts per AG
//! against one.

use super::args::BenchArgs;
use super::engine::{copy_rate, file_ranges, fresh_fs, open_raw_if};
use super::report::{fill, progress, ratio, variant_series, Outcome, Series};
use anyhow::{bail, Result};
use foliofs::device::AlignedBuf;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

/// W4: N files in N directories (one per AG), N writers of 1 MiB
/// buffered sequential writes, `file_mib` MiB in all, fsync at the end;
/// one writeback context per AG vs one context, and the raw file written
/// sequentially with 1 MiB O_DIRECT writes over the same device ranges.
pub fn w4(args: &BenchArgs) -> Result<Outcome> {
    let mut variants = vec!["one context per AG", "one context"];
    if args.raw {
        variants.push("raw O_DIRECT");
        // What any buffered write must do before the device sees a byte:
        // the writers' data copied into memory (no file system).
        variants.push("fill + copy into mapped memory, no I/O");
    }
    let pb = progress((args.rounds * 2) as u64);
    let (_dev, fs) = fresh_fs(args)?;
    let fs = Arc::new(fs);
    let ags = fs.ag_usage().len();
    let n = ags.min(foliofs::fs::MAX_WB_CONTEXTS);
    let per_file = (args.file_mib / n as u64).max(1);
    let root = fs.root_ino();
    let per_ag = fs.superblock().inodes_per_ag as u64;
    let mut dirs = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..n {
        let d = fs.mkdir(root, format!("w4-{i}").as_bytes(), 0o755, 0, 0)?;
        seen.insert(d.ino / per_ag);
        dirs.push(d.ino);
    }
    let raw = open_raw_if(args)?;
    let mut values = vec![Vec::new(); variants.len()];
    let mut extents = vec![Vec::new(); 2];
    // One pass of the N writers, each creating its file in its directory:
    // the files' inodes and the seconds it took, the fsyncs included.
    let pass = || -> Result<(Vec<u64>, f64)> {
        let t = Instant::now();
        let handles: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let fs = fs.clone();
                std::thread::spawn(move || -> Result<u64> {
                    let name = format!("f{i}");
                    let ino = fs.create(d, name.as_bytes(), 0o644, 0, 0)?.ino;
                    let mut buf = vec![0u8; 1 << 20];
                    for m in 0..per_file {
                        fill(&mut buf, (m << 20) / 4096, 4096);
                        fs.write(ino, m << 20, &buf)?;
                    }
                    fs.fsync(ino, false)?;
                    Ok(ino)
                })
            })
            .collect();
        let mut inos = Vec::new();
        for h in handles {
            inos.push(
                h.join()
                    .map_err(|_| anyhow::anyhow!("W4 writer panicked"))??,
            );
        }
        Ok((inos, t.elapsed().as_secs_f64()))
    };
    let unlink_all = || -> Result<()> {
        for (i, &d) in dirs.iter().enumerate() {
            fs.unlink(d, format!("f{i}").as_bytes())?;
        }
        Ok(fs.sync()?)
    };
    // The first pass maps the folio memory fresh (the kernel zeroes every
    // page); later passes reuse it, as a long-running mount does. Measured
    // apart, so the rounds compare the steady state with the raw device.
    pb.set_message("W4 first pass");
    fs.set_writeback_contexts(n);
    let first_pass = (per_file * n as u64) as f64 / pass()?.1;
    unlink_all()?;
    for round in 0..args.rounds {
        for k in 0..2 {
            let v = (k + round) % 2;
            pb.set_message(format!("W4 {}", variants[v]));
            fs.set_writeback_contexts(if v == 0 { n } else { 1 });
            let (inos, took) = pass()?;
            values[v].push((per_file * n as u64) as f64 / took);
            let mut ranges = Vec::new();
            let mut ext = 0usize;
            for &ino in &inos {
                let r = file_ranges(&fs, ino)?;
                ext += r.len();
                ranges.extend(r);
            }
            extents[v].push(ext as f64 / n as f64);
            if let (Some(raw), 0) = (&raw, v) {
                // The same bytes over the same device ranges, one stream.
                let mut buf = AlignedBuf::zeroed(1 << 20);
                fill(&mut buf, 0, 4096);
                let t = Instant::now();
                let mut bytes = 0u64;
                for &(off, len) in &ranges {
                    let mut at = 0;
                    while at < len {
                        let k = (len - at).min(buf.len() as u64) as usize;
                        raw.write_all_at(&buf[..k], off + at)?;
                        at += k as u64;
                        bytes += k as u64;
                    }
                }
                raw.sync_data()?;
                values[2].push(bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64());
                values[3].push(copy_rate(n, per_file)?);
            }
            unlink_all()?;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let st = fs.writeback_stats();
    let mapped = fs.counters().folio_bytes_mapped;
    match Arc::try_unwrap(fs) {
        Ok(fs) => fs.unmount()?,
        Err(_) => bail!("file system still in use after W4"),
    }
    let mut series: Vec<Series> = variants
        .iter()
        .zip(&values)
        .map(|(name, v)| Series {
            name: name.to_string(),
            unit: "MiB/s".into(),
            values: v.clone(),
        })
        .collect();
    series.extend(variant_series(
        &variants[..2],
        &[("extents per file", "extents", &extents)],
    ));
    let mut ratios = vec![
        ratio(
            "per AG / one context (MiB/s)",
            &values[0],
            &values[1],
            "243 -> 759 MiB/s (+212%)",
        ),
        ratio(
            "per AG / one context (extents per file)",
            &extents[0],
            &extents[1],
            "extents unchanged (target <= 1)",
        ),
    ];
    if args.raw {
        ratios.push(ratio(
            "per AG / raw 1 MiB writes",
            &values[0],
            &values[2],
            "target >= 0.8",
        ));
        ratios.push(ratio(
            "fill + copy / raw 1 MiB writes",
            &values[3],
            &values[2],
            "CPU ceiling of a buffered path",
        ));
    }
    Ok(Outcome {
        id: "W4".into(),
        title: format!(
            "{n} writers x {per_file} MiB in {n} directories ({} AGs), 1 MiB buffered writes, fsync at end",
            seen.len()
        ),
        series,
        ratios,
        notes: vec![
            format!(
                "bytes written back per context over the run: {}",
                st.iter()
                    .map(|c| format!("{} MiB", c.bytes >> 20))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "first pass (not in the rounds), one context per AG: {first_pass:.0} MiB/s; it maps the folio memory fresh: {} MiB mapped for {} MiB written in all, later passes reuse freed folios",
                mapped >> 20,
                (args.rounds as u64 * 2 + 1) * per_file * n as u64
            ),
        ],
    })
}

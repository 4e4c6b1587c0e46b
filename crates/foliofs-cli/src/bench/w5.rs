//! W5 (seeds/xfs-subblock-prealloc.txt): 1-byte appends to a new file,
//! mapping by whole blocks with speculative preallocation against mapping
//! by write length.

use super::args::BenchArgs;
use super::engine::fresh_fs;
use super::report::{median, progress, ratio, variant_series, Outcome};
use anyhow::Result;
use foliofs::{Fs, MountOptions};
use std::time::Instant;

/// W5: 1-byte appends to a new file until 64 MiB or the time limit, then
/// close; whole-block mapping with speculative preallocation vs mapping by
/// write length (remounted with the knob for each pass).
pub fn w5(args: &BenchArgs) -> Result<Outcome> {
    let variants = ["whole-block mapping + prealloc", "mapping by write length"];
    let limit = 64u64 << 20;
    let secs = (args.seconds * 5.0).min(10.0);
    let pb = progress((args.rounds * 2) as u64);
    let (dev, fs) = fresh_fs(args)?;
    fs.unmount()?;
    let mut rate = vec![Vec::new(); 2];
    let mut lookups = vec![Vec::new(); 2];
    let mut extents = vec![Vec::new(); 2];
    let mut post_eof = vec![Vec::new(); 2];
    for round in 0..args.rounds {
        for k in 0..2 {
            let v = (k + round) % 2;
            pb.set_message(format!("W5 {}", variants[v]));
            let o = MountOptions {
                map_by_write_length: v == 1,
                ..Default::default()
            };
            let fs = Fs::mount(dev.clone(), o)?;
            let name = format!("w5-{round}-{v}");
            let ino = fs.create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)?.ino;
            fs.open(ino)?;
            let c0 = fs.counters();
            let t = Instant::now();
            let mut n = 0u64;
            while n < limit {
                fs.write(ino, n, &[(n % 251) as u8])?;
                n += 1;
                if n % 65536 == 0 && t.elapsed().as_secs_f64() > secs {
                    break;
                }
            }
            let took = t.elapsed().as_secs_f64();
            let c = fs.counters();
            fs.release(ino)?;
            let ext = fs.extents(ino)?;
            let mapped: u64 = ext.iter().map(|e| e.blocks).sum();
            rate[v].push(n as f64 / took);
            lookups[v].push((c.mapping_lookups - c0.mapping_lookups) as f64 / n as f64);
            extents[v].push(ext.len() as f64);
            post_eof[v].push(mapped.saturating_sub(n.div_ceil(fs.block_size())) as f64);
            fs.unlink(fs.root_ino(), name.as_bytes())?;
            fs.unmount()?;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let series = variant_series(
        &variants,
        &[
            ("", "appends/s", &rate),
            ("mapping lookups per append", "lookups", &lookups),
            ("extents after close", "extents", &extents),
            ("blocks past EOF after close", "blocks", &post_eof),
        ],
    );
    Ok(Outcome {
        id: "W5".into(),
        title: format!("1-byte appends to a new file, 64 MiB or {secs:.0} s, then close"),
        series,
        ratios: vec![ratio(
            "whole-block / write-length (appends/s)",
            &rate[0],
            &rate[1],
            "aim7 -13.6% from the regression",
        )],
        notes: vec![format!(
            "mapping lookups per append: {:.5} whole-block vs {:.3} by write length (target <= 0.01)",
            median(&lookups[0]),
            median(&lookups[1])
        )],
    })
}

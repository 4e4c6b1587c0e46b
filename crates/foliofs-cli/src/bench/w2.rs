//! W2 (seeds/btrfs-large-dio-reads.txt): large sequential direct reads
//! with every checksum verified, device requests up to the cap against one
//! block each.

use super::args::BenchArgs;
use super::engine::{file_ranges, fresh_fs, open_raw_if, raw_read_at};
use super::report::{huge_buf, make_file, progress, ratio, Outcome, Series};
use anyhow::{bail, Result};
use std::time::{Duration, Instant};

/// W2: sequential 1 MiB direct reads at queue depth 1, checksums verified;
/// the request cap at 256 blocks vs 1 block, and the raw file.
pub fn w2(args: &BenchArgs) -> Result<Outcome> {
    let variants: Vec<&str> = if args.raw {
        vec!["cap 256 blocks", "cap 1 block", "raw O_DIRECT"]
    } else {
        vec!["cap 256 blocks", "cap 1 block"]
    };
    let pb = progress((args.rounds * 2) as u64);
    let (_dev, fs) = fresh_fs(args)?;
    let ino = make_file(&fs, "w2", args.file_mib, &pb)?;
    let ranges = file_ranges(&fs, ino)?;
    let raw = open_raw_if(args)?;
    let size = args.file_mib << 20;
    // The caller's buffer in huge pages, for the engine and the raw file
    // alike: each request one device request (report::huge_buf).
    let mut whole = huge_buf(1 << 20);
    let buf = &mut whole[..1 << 20];
    let mut values = vec![Vec::new(); variants.len()];
    let c0 = fs.counters();
    // Passes alternate: cap 256 (with the raw file interleaved request by
    // request, so both see the same device moment), then cap 1.
    for round in 0..args.rounds {
        for k in 0..2 {
            let cap1 = (k + round) % 2 == 1;
            pb.set_message(format!("W2 {}", if cap1 { "cap 1" } else { "cap 256" }));
            fs.set_dio_max_blocks(if cap1 { 1 } else { 256 });
            let t = Instant::now();
            let mut spent = [Duration::ZERO; 2];
            let mut bytes = 0u64;
            let mut pos = 0u64;
            let mut i = 0u64;
            while t.elapsed().as_secs_f64() < args.seconds && bytes < 4 * size {
                // One sequential stream whose MiBs are read in turn by the
                // engine and by the raw file, the engine first on even
                // steps and second on odd ones.
                let both = args.raw && !cap1;
                let order: &[usize] = match (both, i % 2) {
                    (false, _) => &[0],
                    (true, 0) => &[0, 1],
                    (true, _) => &[1, 0],
                };
                for (j, &who) in order.iter().enumerate() {
                    let at = (pos + j as u64 * buf.len() as u64) % size;
                    let r = Instant::now();
                    if who == 0 {
                        let n = fs.read_direct(ino, at, buf)?;
                        if n != buf.len() {
                            bail!("short direct read at {at}: {n}");
                        }
                    } else {
                        raw_read_at(raw.as_ref().expect("--raw"), &ranges, at, buf)?;
                    }
                    spent[who] += r.elapsed();
                }
                bytes += buf.len() as u64;
                pos = (pos + order.len() as u64 * buf.len() as u64) % size;
                i += 1;
            }
            let mibs = |d: Duration| bytes as f64 / (1 << 20) as f64 / d.as_secs_f64();
            if cap1 {
                values[1].push(mibs(spent[0]));
            } else {
                values[0].push(mibs(spent[0]));
                if args.raw {
                    values[2].push(mibs(spent[1]));
                }
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let c = fs.counters();
    let verified = (c.dio_read_bytes - c0.dio_read_bytes) / fs.block_size();
    if c.csum_failures != 0 {
        bail!("{} checksum failures during W2", c.csum_failures);
    }
    fs.unmount()?;
    let series: Vec<Series> = variants
        .iter()
        .zip(&values)
        .map(|(n, v)| Series {
            name: n.to_string(),
            unit: "MiB/s".into(),
            values: v.clone(),
        })
        .collect();
    let mut ratios = vec![ratio(
        "cap 256 / cap 1",
        &values[0],
        &values[1],
        "65 -> 196 MiB/s (3x)",
    )];
    if args.raw {
        ratios.push(ratio(
            "cap 256 / raw device",
            &values[0],
            &values[2],
            "target >= 0.9",
        ));
    }
    Ok(Outcome {
        id: "W2".into(),
        title: format!(
            "sequential 1 MiB direct reads, QD1, {} MiB file, checksums verified",
            args.file_mib
        ),
        series,
        ratios,
        notes: vec![format!(
            "{verified} blocks verified against their checksums, 0 failures"
        )],
    })
}

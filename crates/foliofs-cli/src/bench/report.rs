//! What a workload reports (series of figures, ratios, notes), the
//! statistics over rounds, the tables, and the helpers every runner uses
//! (progress bars, the data pattern, timed threads).

use anyhow::{bail, Result};
use comfy_table::Table;
use foliofs::device::AlignedBuf;
use foliofs::Fs;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One measured series: a value per round.
#[derive(Serialize, Clone, Debug)]
pub struct Series {
    pub name: String,
    pub unit: String,
    pub values: Vec<f64>,
}

/// A ratio between two series, per round.
#[derive(Serialize, Clone, Debug)]
pub struct Ratio {
    pub what: String,
    pub values: Vec<f64>,
    pub seed: String,
}

#[derive(Serialize, Clone, Debug)]
pub struct Outcome {
    pub id: String,
    pub title: String,
    pub series: Vec<Series>,
    pub ratios: Vec<Ratio>,
    pub notes: Vec<String>,
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return 0.0;
    }
    s[s.len() / 2]
}

pub(super) fn spread(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

pub fn ratio(what: &str, a: &[f64], b: &[f64], seed: &str) -> Ratio {
    Ratio {
        what: what.into(),
        values: a.iter().zip(b).map(|(x, y)| x / y.max(1e-9)).collect(),
        seed: seed.into(),
    }
}

/// Block `b`'s content in every bench file: the same bytes whoever writes
/// them, so raw passes may write over the file without breaking its
/// checksums.
pub fn fill(buf: &mut [u8], first_block: u64, bs: usize) {
    for (i, blk) in buf.chunks_mut(bs).enumerate() {
        let b = first_block + i as u64;
        for (k, w) in blk.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&(b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k as u64).to_le_bytes());
        }
    }
}

pub fn progress(total: u64) -> ProgressBar {
    progress_in(total, "passes")
}

/// A progress bar counting `unit`.
pub fn progress_in(total: u64, unit: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{{msg:>24}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{elapsed}})"
        ))
        .unwrap()
        .progress_chars("=> "),
    );
    pb
}

/// Per variant, one series per metric (label, unit, values per variant),
/// named "variant" for an empty label, else "variant: label".
pub(super) fn variant_series(
    variants: &[&str],
    metrics: &[(&str, &str, &[Vec<f64>])],
) -> Vec<Series> {
    let mut out = Vec::new();
    for (v, name) in variants.iter().enumerate() {
        for (label, unit, values) in metrics {
            out.push(Series {
                name: if label.is_empty() {
                    name.to_string()
                } else {
                    format!("{name}: {label}")
                },
                unit: unit.to_string(),
                values: values[v].clone(),
            });
        }
    }
    out
}

pub fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Run `threads` workers for `secs` seconds; returns operations per second.
pub fn run_threads<F, W>(threads: usize, secs: f64, make: F) -> Result<f64>
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> W,
    W: FnOnce() -> Result<()> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|i| std::thread::spawn(make(i, stop.clone(), count.clone())))
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut r = Ok(());
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => r = Err(e),
            Err(_) => bail!("a benchmark thread panicked"),
        }
    }
    r?;
    Ok(count.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64())
}

/// A figure with as many decimals as its size needs.
pub(super) fn num(x: f64) -> String {
    match x.abs() {
        a if a >= 100.0 || a == 0.0 => format!("{x:.0}"),
        a if a >= 1.0 => format!("{x:.2}"),
        _ => format!("{x:.5}"),
    }
}

pub fn print(outcomes: &[Outcome], markdown: bool) {
    for o in outcomes {
        println!("{}: {}", o.id, o.title);
        if markdown {
            println!();
        }
        let mut t = Table::new();
        if markdown {
            t.load_style(comfy_table::presets::ASCII_MARKDOWN);
        }
        t.set_header(vec!["variant", "median", "min", "max", "unit"]);
        for s in &o.series {
            let (lo, hi) = spread(&s.values);
            t.add_row(vec![
                s.name.clone(),
                num(median(&s.values)),
                num(lo),
                num(hi),
                s.unit.clone(),
            ]);
        }
        println!("{t}");
        if markdown {
            println!();
        }
        let mut t = Table::new();
        if markdown {
            t.load_style(comfy_table::presets::ASCII_MARKDOWN);
        }
        t.set_header(vec!["ratio", "median", "min", "max", "seed"]);
        for r in &o.ratios {
            let (lo, hi) = spread(&r.values);
            t.add_row(vec![
                r.what.clone(),
                format!("{:.2}", median(&r.values)),
                format!("{lo:.2}"),
                format!("{hi:.2}"),
                r.seed.clone(),
            ]);
        }
        println!("{t}");
        if markdown {
            println!();
        }
        for n in &o.notes {
            println!("{}{n}", if markdown { "- " } else { "  " });
        }
        println!();
    }
}

/// A buffer of at least `len` bytes in transparent huge pages
/// (`foliofs::device::HUGE_PAGE`), for a caller's large direct reads: a
/// request into 4 KiB pages takes a device segment per page, and the
/// virtio disk here splits a 1 MiB one in two and serves the halves one
/// after the other (docs/BENCH.md, W2).
pub fn huge_buf(len: usize) -> AlignedBuf {
    AlignedBuf::zeroed(len.next_multiple_of(foliofs::device::HUGE_PAGE))
}

/// Create `name` holding `mib` MiB written with 1 MiB direct writes.
pub fn make_file(fs: &Fs, name: &str, mib: u64, pb: &ProgressBar) -> Result<u64> {
    let bs = fs.block_size() as usize;
    let ino = fs.create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)?.ino;
    let mut buf = AlignedBuf::zeroed(1 << 20);
    pb.set_message(format!("writing {name}"));
    for m in 0..mib {
        fill(&mut buf, (m << 20) / bs as u64, bs);
        fs.write_direct(ino, m << 20, &buf)?;
    }
    fs.sync()?;
    Ok(ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (1.0, 3.0));
        let r = ratio("a/b", &[4.0, 9.0], &[2.0, 3.0], "");
        assert_eq!(r.values, vec![2.0, 3.0]);
    }
}

//! `foliofs bench`: the seed workloads on the engine, in A/B pairs (the
//! technique on, then its knob off) alternated round by round in one run,
//! with the raw image file read and written with O_DIRECT beside them.
//!
//! W1 (per-block dirty tracking in large folios), W2 (large checksummed
//! direct reads), W3 (shared inode lock for direct overwrites), W4
//! (parallel writeback by AG) and W5 (speculative preallocation for tiny
//! appends); each workload is a module (`w1` .. `w5`) over the engine runner
//! (`engine`), or, with `--target`, the system-call runner (`target`);
//! both return `Outcome`s (`report`), printed as tables or JSON. With
//! `--image s3://BUCKET/PREFIX` the engine runs on an object image and the
//! server's own floor is measured beside it (`object`).

mod args;
mod cpu;
mod engine;
mod object;
mod report;
mod target;
mod w1;
mod w2;
mod w3;
mod w4;
mod w5;
mod w6;

use anyhow::{bail, Context, Result};
pub use args::BenchArgs;
pub use report::{median, print, progress_in, Outcome, Series};
use w1::w1;
use w2::w2;
use w3::w3;
use w4::w4;
use w5::w5;
use w6::w6;

pub fn run(args: &BenchArgs) -> Result<Vec<Outcome>> {
    if args.rounds == 0 || args.file_mib == 0 || args.seconds <= 0.0 {
        bail!("--rounds, --file-mib and --seconds must be positive");
    }
    let mut which: Vec<String> = args.workloads.iter().map(|w| w.to_uppercase()).collect();
    let targets = !args.target.is_empty();
    if which.iter().any(|w| w == "ALL") {
        which = ["W1", "W2", "W3", "W4", "W5", "W6"]
            .map(String::from)
            .to_vec();
        if targets {
            which.push("CP".into());
        }
    }
    for w in &which {
        if w == "CP" && !targets {
            bail!("CP copies files onto file systems: it runs with --target DIR");
        }
        if !["W1", "W2", "W3", "W4", "W5", "W6", "CP"].contains(&w.as_str()) {
            bail!("unknown workload {w}: choose W1, W2, W3, W4, W5, W6, CP (with --target) or all");
        }
    }
    if targets {
        return target::run(args, &which);
    }
    if let Some(url) = crate::object::url_of(&args.image) {
        return object::run(args, url, &which);
    }
    let mut out = Vec::new();
    for w in &which {
        let r = workload(w, args);
        if !args.keep {
            let _ = std::fs::remove_file(&args.image);
        }
        out.push(r?);
    }
    Ok(out)
}

/// Workload `w` (checked) on the engine runner.
fn workload(w: &str, args: &BenchArgs) -> Result<Outcome> {
    let r = match w {
        "W1" => w1(args),
        "W2" => w2(args),
        "W3" => w3(args),
        "W4" => w4(args),
        "W5" => w5(args),
        "W6" => w6(args),
        _ => unreachable!("checked above"),
    };
    r.with_context(|| format!("workload {w}"))
}

//! The command line of `foliofs bench`.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Workloads: W1, W2, W3, W4, W5, W6 (metadata), CP (with --target:
    /// `cp` of a large file onto each target and back) or all.
    #[arg(default_value = "all")]
    pub workloads: Vec<String>,
    /// Image file to build the test file system in (made anew, removed
    /// afterwards unless --keep); or an object image URL
    /// (s3://BUCKET/PREFIX): images made under a fresh prefix below it,
    /// the server's floor measured beside them, all deleted afterwards
    /// unless --keep.
    #[arg(long, default_value = "foliofs-bench.img")]
    pub image: PathBuf,
    /// Size of each workload's file in MiB.
    #[arg(long, default_value_t = 1024)]
    pub file_mib: u64,
    /// Size of CP's file in MiB (less when a target or the scratch
    /// directory beside --image has too little room: the table says).
    #[arg(long, default_value_t = 4096)]
    pub cp_mib: u64,
    /// A/B rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds per measured pass.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Thread counts for W3.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub threads: Vec<usize>,
    /// Also run each access pattern on the raw image file with O_DIRECT.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub raw: bool,
    #[arg(long)]
    pub json: bool,
    /// Print the tables as Markdown (for docs/BENCH-RESULTS.md).
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Run the workloads through system calls on these directories
    /// instead (kernel file systems, a foliofs FUSE mount): each target
    /// is a variant, compared with the first. Repeat for several.
    #[arg(long, value_name = "DIR")]
    pub target: Vec<PathBuf>,
    /// Also run W1 and W3 through system calls on this directory (a
    /// kernel file system, e.g. an XFS loop mount) as one more variant in
    /// the same alternated rounds: `kernel (DIR)`, with `engine / kernel`
    /// ratios.
    #[arg(long, value_name = "DIR", conflicts_with = "target")]
    pub vs: Option<PathBuf>,
    /// Write a chart per workload (SVG and PNG) into this directory.
    #[arg(long, value_name = "DIR")]
    pub chart: Option<PathBuf>,
    /// Keep the image file.
    #[arg(long)]
    pub keep: bool,
    /// With an object image URL: its options, as for `foliofs mount -o`
    /// (`cache_dir=DIR,durability=local`; each image gets its own
    /// directory below DIR).
    #[arg(long, value_name = "LIST")]
    pub object_options: Option<String>,
}

impl BenchArgs {
    /// `--vs DIR`: the working directory for the kernel variant (made anew)
    /// and the variant's name, `kernel (DIR)`.
    pub(super) fn vs_dir(&self) -> Result<Option<(PathBuf, String)>> {
        let Some(t) = &self.vs else {
            return Ok(None);
        };
        if !t.is_dir() {
            bail!("--vs {}: not a directory", t.display());
        }
        let d = t.join("foliofs-bench-vs");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).with_context(|| format!("cannot create {}", d.display()))?;
        Ok(Some((d, format!("kernel ({})", t.display()))))
    }
}

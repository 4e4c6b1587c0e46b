//! CPU in use over a span of a run, in cores: this process's (all its
//! threads, `getrusage`) and the rest of the machine's (`/proc/stat`'s
//! busy time less this process's). With the object server on the same
//! machine the rest is mostly the server, so the object runner can say
//! how the cores were shared while it measured a floor and a workload.

use std::time::Instant;

/// A span begun at `Span::start`.
pub(super) struct Span {
    at: Instant,
    own: f64,
    busy: Option<f64>,
}

/// Cores in use over a span.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Cores {
    /// This process.
    pub own: f64,
    /// The rest of the machine (None where /proc/stat cannot be read).
    pub rest: Option<f64>,
}

impl Span {
    pub(super) fn start() -> Span {
        Span {
            at: Instant::now(),
            own: own_seconds(),
            busy: machine_busy_seconds(),
        }
    }

    /// The cores used since `start`.
    pub(super) fn cores(&self) -> Cores {
        let wall = self.at.elapsed().as_secs_f64().max(1e-9);
        let own = own_seconds() - self.own;
        let rest = match (self.busy, machine_busy_seconds()) {
            (Some(a), Some(b)) => Some(((b - a) - own).max(0.0) / wall),
            _ => None,
        };
        Cores {
            own: own / wall,
            rest,
        }
    }
}

/// User and system CPU seconds of this process so far.
fn own_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given, zeroed here.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// The machine's busy CPU seconds so far (every CPU, idle and I/O wait
/// left out), from /proc/stat.
fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    busy_seconds(&stat, clock_ticks())
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        n if n > 0 => n as f64,
        _ => 100.0,
    }
}

/// The busy seconds in /proc/stat's `cpu` line: user, nice, system, irq,
/// softirq and steal, in ticks of `hz`.
fn busy_seconds(stat: &str, hz: f64) -> Option<f64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if f.len() < 8 {
        return None;
    }
    Some((f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / hz)
}

/// "0.42 + 1.61 of N": this process's cores, then the rest's.
pub(super) fn shares(c: &Cores) -> String {
    match c.rest {
        Some(rest) => format!("{:.2} + {:.2}", c.own, rest),
        None => format!("{:.2} + ?", c.own),
    }
}

/// The machine's CPUs.
pub(super) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_leaves_idle_and_iowait_out() {
        let stat = "cpu  100 20 30 400 50 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        // user + nice + system + irq + softirq + steal, at 100 ticks/s.
        assert_eq!(busy_seconds(stat, 100.0), Some(1.71));
        assert_eq!(busy_seconds("cpu0 1 2 3\n", 100.0), None);
        assert_eq!(busy_seconds("cpu  1 2 x 4 5 6 7 8\n", 100.0), None);
    }
}

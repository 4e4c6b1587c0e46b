//! Crash consistency (the harness is `foliofs::torture`): random
//! workloads from every path on the crash-recording device, cut after
//! every flush with dropped, reordered and torn writes; each state must
//! mount, read back both ways without a checksum error, keep every fsynced
//! byte, hold no byte its file was never given, and pass fsck.
//!
//! FOLIOFS_CRASH_STATES (default 1,200) and FOLIOFS_SEED control the run;
//! a failure prints its seed and how to replay it.

use foliofs::torture::crash_round;

mod common;
use common::env_u64;

#[test]
fn crash_at_every_flush_with_torn_writes() {
    let seed = env_u64("FOLIOFS_SEED", 7);
    let want = env_u64("FOLIOFS_CRASH_STATES", 1200);
    let (mut states, mut rounds) = (0u64, 0u64);
    while states < want {
        let r =
            crash_round(seed.wrapping_add(rounds), 400, 6, || {}).unwrap_or_else(|f| panic!("{f}"));
        assert!(
            r.epochs > 10,
            "a workload of {} ops flushed only {} times",
            r.ops,
            r.epochs
        );
        states += r.states;
        rounds += 1;
    }
    eprintln!("checked {states} crash states in {rounds} rounds");
}

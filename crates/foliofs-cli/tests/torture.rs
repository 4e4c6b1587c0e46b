//! `foliofs torture` at small sizes: the harnesses run, check, and say so.

use std::process::Command;

fn foliofs(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(args)
        .output()
        .unwrap()
}

/// `foliofs torture fsx` on a fresh engine image with `args`: it passes,
/// runs `ops` operations in all and removes its image.
fn fsx_engine(image: &str, args: &[&str], ops: u64) {
    let img = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(image);
    let mut all = vec!["torture", "fsx", "--image", img.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = foliofs(&all);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&format!("{ops} operations")), "{stdout}");
    assert!(stdout.contains("0 failures"), "{stdout}");
    assert!(!img.exists(), "the image is removed after a clean run");
}

#[test]
fn fsx_on_the_engine() {
    fsx_engine(
        "fsx-engine.img",
        &["--ops", "20000", "--runs", "2", "--seed", "5"],
        40_000,
    );
}

#[test]
fn fsx_threads_share_one_mount() {
    fsx_engine(
        "fsx-threads.img",
        &["--ops", "8000", "--threads", "4", "--seed", "21"],
        32_000,
    );
}

#[test]
fn crash_states_are_checked_and_counted() {
    let out = foliofs(&[
        "torture", "crash", "--rounds", "1", "--seed", "9", "--ops", "150",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let states: u64 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no state count in {stdout}"));
    assert!(states >= 50, "{stdout}");
    assert!(
        stdout.contains("seeds 9..=9") && stdout.contains("0 failures"),
        "{stdout}"
    );
}

#[test]
fn torture_rejects_bad_input() {
    for args in [
        &["torture", "fsx", "--ops", "0"][..],
        &["torture", "fsx", "--threads", "0"][..],
        &["torture", "fsx", "--target", "/nonexistent/dir"][..],
        &["torture", "fsx", "--seed", "x"][..],
        &["torture", "nothing"][..],
        &["torture", "crash", "--states", "0"][..],
        &["torture", "crash", "--per-epoch", "0"][..],
    ] {
        let out = foliofs(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!out.stderr.is_empty(), "{args:?} said nothing");
    }
}

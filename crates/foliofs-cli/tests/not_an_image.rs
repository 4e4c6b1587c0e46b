//! A file that never held foliofs is reported as such by fsck and stat,
//! not as a damaged superblock; a damaged foliofs superblock still is.

use std::path::{Path, PathBuf};
use std::process::Command;

fn foliofs(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(args)
        .output()
        .unwrap()
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

/// fsck and stat of `img` both fail (exit 8) with `want` in their message.
fn both_fail_with(img: &Path, want: &str) {
    for cmd in ["fsck", "stat"] {
        let out = foliofs(&[cmd.as_ref(), img.as_os_str()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(8), "{cmd}: {err}");
        assert!(err.contains(want), "{cmd}: want '{want}' in: {err}");
        assert!(
            err.contains(&img.display().to_string()),
            "{cmd} names the image: {err}"
        );
    }
}

#[test]
fn zeros_and_random_bytes_are_not_foliofs_images() {
    let zeros = tmp("zeros.img");
    std::fs::write(&zeros, vec![0u8; 4 << 20]).unwrap();
    both_fail_with(&zeros, "not a foliofs image");
    // A small xorshift generator: bytes that are no file system at all.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..4 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let random = tmp("random.img");
    std::fs::write(&random, noise).unwrap();
    both_fail_with(&random, "not a foliofs image");
    for f in [zeros, random] {
        std::fs::remove_file(f).unwrap();
    }
}

#[test]
fn a_flipped_superblock_byte_is_a_checksum_mismatch() {
    let img = tmp("flipped.img");
    let _ = std::fs::remove_file(&img);
    let out = foliofs(&[
        "mkfs".as_ref(),
        img.as_os_str(),
        "--size".as_ref(),
        "16M".as_ref(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One byte of the label in both slots (blocks 0 and 1 of 4 KiB): the
    // magic stays, the checksum no longer holds.
    let mut bytes = std::fs::read(&img).unwrap();
    for slot in 0..2 {
        bytes[slot * 4096 + 160] ^= 0x5a;
    }
    std::fs::write(&img, bytes).unwrap();
    both_fail_with(&img, "checksum mismatch");
    let out = foliofs(&["fsck".as_ref(), img.as_os_str()]);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("not a foliofs image"),
        "a damaged foliofs superblock is still called one"
    );
    std::fs::remove_file(img).unwrap();
}

//! The fuzz targets' saved inputs, replayed on every test run: each file
//! under `fuzz/seeds/<target>/` (a corpus minimized with `cargo fuzz
//! cmin`, and every input a fuzzing session found failing, fixed since)
//! goes through the target's body (`foliofs::torture::fuzz`), which
//! asserts what the target asserts. A change that makes one of them
//! panic fails here, not only in the next fuzzing session.

use foliofs::torture::fuzz;
use std::path::PathBuf;

fn replay(target: &str, body: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    inputs.sort();
    assert!(
        inputs.len() >= 20,
        "{}: only {} inputs",
        dir.display(),
        inputs.len()
    );
    for p in &inputs {
        let data = std::fs::read(p).unwrap();
        if std::panic::catch_unwind(|| body(&data)).is_err() {
            panic!("{target}: input {} fails", p.display());
        }
    }
}

#[test]
fn decode_metadata_seeds() {
    replay("decode_metadata", fuzz::decode_metadata);
}

#[test]
fn mount_image_seeds() {
    replay("mount_image", fuzz::mount_image);
}

#[test]
fn ops_model_seeds() {
    replay("ops_model", fuzz::ops_model);
}

/// Fuzzing without cargo-fuzz: the saved `mount_image` inputs mutated by
/// a seeded generator (bytes flipped, patches appended, some with their
/// block's checksum stamped good, so damage hides behind valid
/// checksums), each through the target's body, which repairs the image
/// and asserts that a repair that fixed everything leaves it clean and
/// mountable. By hand: `FOLIOFS_FUZZ_SECS=600 cargo test --release -p
/// foliofs --test fuzz_seeds -- --ignored --nocapture`
/// (`FOLIOFS_FUZZ_SEED` picks the generator's seed); a failing input is
/// written to the temporary directory and named.
#[test]
#[ignore]
fn mount_image_mutated() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    let secs: u64 = std::env::var("FOLIOFS_FUZZ_SECS")
        .map(|s| s.parse().unwrap())
        .unwrap_or(30);
    let seed: u64 = std::env::var("FOLIOFS_FUZZ_SEED")
        .map(|s| s.parse().unwrap())
        .unwrap_or(0);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/mount_image");
    let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    corpus.sort();
    let mut rng = SmallRng::seed_from_u64(seed);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let (mut runs, mut failed) = (0u64, 0u64);
    std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
    while std::time::Instant::now() < end {
        let mut data = corpus[rng.random_range(0..corpus.len())].clone();
        for _ in 0..rng.random_range(1..=4) {
            match rng.random_range(0..3) {
                0 if !data.is_empty() => {
                    let i = rng.random_range(0..data.len());
                    data[i] ^= 1 << rng.random_range(0..8);
                }
                _ => {
                    // A patch: block, offset, length (bit 7: stamp the
                    // block's checksum), bytes.
                    let len = rng.random_range(1..=8u8);
                    let stamp = if rng.random_bool(0.5) { 0x80 } else { 0 };
                    data.push(rng.random_range(0..=255));
                    data.extend_from_slice(&rng.random_range(0..4096u16).to_le_bytes());
                    data.push(len | stamp);
                    data.extend((0..len).map(|_| rng.random::<u8>()));
                }
            }
        }
        runs += 1;
        if std::panic::catch_unwind(|| fuzz::mount_image(&data)).is_err() {
            failed += 1;
            let p = std::env::temp_dir().join(format!("mount_image-fail-{seed}-{runs}"));
            std::fs::write(&p, &data).unwrap();
            eprintln!("failing input: {}", p.display());
        }
    }
    let _ = std::panic::take_hook();
    eprintln!("mount_image mutated: {runs} inputs, {failed} failed");
    assert_eq!(failed, 0);
}

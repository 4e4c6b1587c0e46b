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

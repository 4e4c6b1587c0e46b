//! `foliofs bench` at tiny sizes: every workload runs, reports non-zero
//! figures and valid JSON. The real figures are a benchmark, not a test.

use std::process::Command;

/// `foliofs bench ARGS --json --image IMAGE` at tiny sizes: its outcomes,
/// and their ids in order.
fn bench_json(
    args: &[&str],
    image: impl AsRef<std::ffi::OsStr>,
) -> (Vec<serde_json::Value>, Vec<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .arg("bench")
        .args(args)
        .args(["--rounds", "2", "--seconds", "0.2", "--json", "--image"])
        .arg(image)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let outcomes = v.as_array().unwrap().clone();
    let ids = outcomes
        .iter()
        .map(|o| o["id"].as_str().unwrap().to_string())
        .collect();
    (outcomes, ids)
}

#[test]
fn bench_smoke_json() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let img = dir.join("bench-smoke.img");
    let (outcomes, ids) = bench_json(&["all", "--file-mib", "16", "--threads", "1,2"], &img);
    assert_eq!(ids, ["W1", "W2", "W3", "W4", "W5", "W6"]);
    for o in &outcomes {
        for s in o["series"].as_array().unwrap() {
            let vals = s["values"].as_array().unwrap();
            assert_eq!(vals.len(), 2, "{s}");
            assert!(vals.iter().all(|x| x.as_f64().unwrap() >= 0.0), "{s}");
            // Rates are measured, never zero; counts (lookups, blocks
            // past EOF) may be.
            if ["MiB/s", "IOPS", "appends/s", "entries/s"].contains(&s["unit"].as_str().unwrap()) {
                assert!(vals.iter().all(|x| x.as_f64().unwrap() > 0.0), "{s}");
            }
        }
        for r in o["ratios"].as_array().unwrap() {
            let vals = r["values"].as_array().unwrap();
            assert!(vals.iter().all(|x| x.as_f64().unwrap().is_finite()), "{r}");
        }
    }
    assert!(!img.exists(), "the bench image is removed afterwards");
}

/// `--image URL`: W1 and W4 on an object image (a `file://` store here,
/// SeaweedFS in BENCH.md), the server's floor and the cold read beside
/// them with their ratios, and nothing left in the store afterwards.
#[test]
fn bench_on_an_object_image() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-object");
    let _ = std::fs::remove_dir_all(&dir);
    let (outcomes, ids) = bench_json(
        &["W1", "W4", "--file-mib", "16"],
        format!("file://{}", dir.display()),
    );
    assert_eq!(ids, ["W1", "W4", "OBJ"]);
    let names: Vec<&str> = outcomes
        .iter()
        .flat_map(|o| o["series"].as_array().unwrap())
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(!names.iter().any(|n| n.contains("raw")), "{names:?}");
    let ratios: Vec<&str> = outcomes[2]["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["what"].as_str().unwrap())
        .collect();
    for want in [
        "W1 fdatasyncs/s",
        "W4 / 8 MiB PUTs",
        "cold read / 8 MiB GETs",
    ] {
        assert!(
            ratios.iter().any(|r| r.starts_with(want)),
            "{want}: {ratios:?}"
        );
    }
    for r in outcomes[2]["ratios"].as_array().unwrap() {
        let vals = r["values"].as_array().unwrap();
        assert!(vals.iter().all(|x| x.as_f64().unwrap() > 0.0), "{r}");
    }
    let mut left = Vec::new();
    let mut dirs = vec![dir.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                left.push(p);
            }
        }
    }
    assert!(left.is_empty(), "objects left after the run: {left:?}");
}

#[test]
fn bench_rejects_bad_input() {
    for args in [
        &["bench", "W9"][..],
        &["bench", "W2", "--rounds", "0"][..],
        &["bench", "W2", "--threads", "x"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_foliofs"))
            .args(args)
            .arg("--image")
            .arg(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bad.img"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!out.stderr.is_empty(), "{args:?} said nothing");
    }
}

#[test]
fn bench_targets_and_charts() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-targets");
    let _ = std::fs::remove_dir_all(&dir);
    let (a, b, charts) = (dir.join("a"), dir.join("b"), dir.join("charts"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(["bench", "all", "--file-mib", "8", "--rounds", "2"])
        .args(["--seconds", "0.1", "--threads", "1,2", "--json"])
        .arg("--target")
        .arg(&a)
        .arg("--target")
        .arg(&b)
        .arg("--chart")
        .arg(&charts)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench --target failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for o in v.as_array().unwrap() {
        let names: Vec<&str> = o["series"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert!(names.iter().any(|n| n.starts_with('a')), "{names:?}");
        assert!(names.iter().any(|n| n.starts_with('b')), "{names:?}");
        for s in o["series"].as_array().unwrap() {
            if s["unit"] != "blocks" {
                let vals = s["values"].as_array().unwrap();
                assert!(vals.iter().all(|x| x.as_f64().unwrap() > 0.0), "{s}");
            }
        }
        assert!(!o["ratios"].as_array().unwrap().is_empty(), "{o}");
        let id = o["id"].as_str().unwrap();
        let svg = std::fs::read_to_string(charts.join(format!("{id}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains(id), "{id}.svg");
        let png = std::fs::read(charts.join(format!("{id}.png"))).unwrap();
        assert_eq!(&png[1..4], b"PNG", "{id}.png");
    }
    // CP (not in `all`): its warm-up copy and the measured ones, each
    // target left as it was.
    let out = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(["bench", "CP", "--cp-mib", "4", "--rounds", "2", "--json"])
        .arg("--image")
        .arg(dir.join("scratch.img"))
        .arg("--target")
        .arg(&a)
        .arg("--target")
        .arg(&b)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench CP failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let series = v[0]["series"].as_array().unwrap();
    assert_eq!(series.len(), 4, "{series:?}");
    for s in series {
        let vals = s["values"].as_array().unwrap();
        assert_eq!(vals.len(), 2, "two measured copies each way: {s}");
        assert!(vals.iter().all(|x| x.as_f64().unwrap() > 0.0), "{s}");
    }
    // The work directories are gone; the targets are left as they were.
    assert_eq!(std::fs::read_dir(&a).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&b).unwrap().count(), 0);
    let out = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(["bench", "W1", "--target"])
        .arg(dir.join("missing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
    std::fs::remove_dir_all(&dir).unwrap();
}

//! `foliofs bench` at tiny sizes: every workload runs, reports non-zero
//! figures and valid JSON. The real figures are a benchmark, not a test.

use std::process::Command;

#[test]
fn bench_smoke_json() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let img = dir.join("bench-smoke.img");
    let out = Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(["bench", "all", "--file-mib", "16", "--rounds", "2"])
        .args(["--seconds", "0.2", "--threads", "1,2", "--json", "--image"])
        .arg(&img)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let outcomes = v.as_array().unwrap();
    let ids: Vec<&str> = outcomes.iter().map(|o| o["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["W1", "W2", "W3", "W4", "W5"]);
    for o in outcomes {
        for s in o["series"].as_array().unwrap() {
            let vals = s["values"].as_array().unwrap();
            assert_eq!(vals.len(), 2, "{s}");
            assert!(vals.iter().all(|x| x.as_f64().unwrap() >= 0.0), "{s}");
            // Rates are measured, never zero; counts (lookups, blocks
            // past EOF) may be.
            if ["MiB/s", "IOPS", "appends/s"].contains(&s["unit"].as_str().unwrap()) {
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

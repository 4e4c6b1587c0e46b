//! Operation sequences against an in-memory model: each input is a program
//! of writes, reads, truncates, punches, direct I/O, fsyncs and remounts on
//! one file; every read must match the model and fsck must stay clean
//! (`foliofs::torture::fuzz::ops_model`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| foliofs::torture::fuzz::ops_model(data));

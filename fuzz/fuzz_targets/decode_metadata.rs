//! Every on-disk decoder on arbitrary bytes, with the checksum re-stamped
//! so the structure checks behind it are reached: typed errors, never a
//! panic (`foliofs::torture::fuzz::decode_metadata`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| foliofs::torture::fuzz::decode_metadata(data));

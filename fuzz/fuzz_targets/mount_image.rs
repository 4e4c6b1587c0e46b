//! Mount (journal replay), read everything, fsck (data checksums too) and
//! repair an image with fuzzed patches over its metadata and journal:
//! typed errors and EIO, never a panic, never a read of bytes no file was
//! given (`foliofs::torture::fuzz::mount_image`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| foliofs::torture::fuzz::mount_image(data));

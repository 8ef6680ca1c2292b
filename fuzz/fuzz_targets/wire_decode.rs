#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sglrs_fuzz_targets::wire::wire_decode(data));

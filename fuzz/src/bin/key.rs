//! AFL target: [`portcullis_fuzz::key`] (scripts/fuzz.sh key SECONDS).
fn main() {
    afl::fuzz!(|data: &[u8]| portcullis_fuzz::key(data));
}

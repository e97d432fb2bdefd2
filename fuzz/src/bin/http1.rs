//! AFL target: [`portcullis_fuzz::http1`] (scripts/fuzz.sh http1 SECONDS).
fn main() {
    afl::fuzz!(|data: &[u8]| portcullis_fuzz::http1(data));
}

//! AFL target: [`portcullis_fuzz::config`] (scripts/fuzz.sh config SECONDS).
fn main() {
    afl::fuzz!(|data: &[u8]| portcullis_fuzz::config(data));
}

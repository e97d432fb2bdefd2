//! AFL target: [`portcullis_fuzz::admin`] (scripts/fuzz.sh admin SECONDS).
fn main() {
    afl::fuzz!(|data: &[u8]| portcullis_fuzz::admin(data));
}

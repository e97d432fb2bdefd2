//! AFL target: [`portcullis_fuzz::jwt`] (scripts/fuzz.sh jwt SECONDS).
fn main() {
    afl::fuzz!(|data: &[u8]| portcullis_fuzz::jwt(data));
}

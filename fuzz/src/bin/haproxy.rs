//! AFL target: [`portcullis_fuzz::haproxy`] (scripts/fuzz.sh haproxy SECONDS).
fn main() {
    afl::fuzz!(|data: &[u8]| portcullis_fuzz::haproxy(data));
}

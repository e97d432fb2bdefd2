//! AFL target: [`portcullis_fuzz::proxy_protocol`] (scripts/fuzz.sh proxy_protocol SECONDS).
fn main() {
    afl::fuzz!(|data: &[u8]| portcullis_fuzz::proxy_protocol(data));
}

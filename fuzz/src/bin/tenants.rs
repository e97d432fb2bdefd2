//! AFL target: [`portcullis_fuzz::tenants`] (scripts/fuzz.sh tenants SECONDS).
fn main() {
    afl::fuzz!(|data: &[u8]| portcullis_fuzz::tenants(data));
}

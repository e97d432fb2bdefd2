//! The `jwt` target's seeds are what they say: the signed ones (made with the `openssl`
//! CLI from src/ratelimit/testdata/) verify against the harness's keys, the others do not,
//! so the harness's property is exercised on both sides.

use portcullis::ratelimit::jwt::Verifier;
use std::path::Path;

#[test]
fn the_signed_seeds_verify_and_the_others_do_not() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/jwt");
    let jwks = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/jwt.jwks")).unwrap();
    let v = Verifier::new(
        Some(&jwks),
        Some(b"0123456789abcdef0123456789abcdef"),
        None,
        None,
    )
    .unwrap();
    let now = 1_800_000_000;
    for (name, ok) in [
        ("rs256", true),
        ("es256", true),
        ("hs256", true),
        ("alg_none", false),
        ("kid_of_other_alg", false),
        ("expired_hs256", false),
        ("garbage", false),
    ] {
        let token = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(v.verify(&token, now).is_ok(), ok, "{name}");
    }
}

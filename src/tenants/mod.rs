//! Who is calling: keys that are identities (CONTRACT §14).

pub mod jwt;

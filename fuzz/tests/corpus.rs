//! Every committed corpus file (`fuzz/corpus/<target>/`) through its harness: the seeds
//! and the regressions the fuzzers found stay passing in the normal test suite.

use std::path::Path;

#[test]
fn every_corpus_file_passes_its_harness() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut n = 0;
    for (name, harness) in portcullis_fuzz::TARGETS {
        let dir = root.join(name);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let run = std::panic::catch_unwind(|| harness(&data));
            assert!(run.is_ok(), "{name}: {} fails its harness", path.display());
            n += 1;
        }
    }
    assert!(n >= portcullis_fuzz::TARGETS.len(), "{n} corpus files");
}

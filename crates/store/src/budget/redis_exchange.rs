//! The Redis budget's fleet exchanges for the culling loop, each one round trip: the
//! backends' error counts (a bucket per check interval, summed over the window), the keys
//! blamed for errors and the cull notes (who culled which backend, by which rule), both
//! hashes whose entries last until their own `until`.

use super::redis::RedisBudget;
use crate::StoreError;
use portcullis_policy::cull::{Buckets, CullNote, FleetBlame, FleetDelta};

impl RedisBudget {
    /// Publish `notes` and read the upstream's notes still in force at `now_ms`, in one
    /// round trip.
    pub(super) async fn fleet_notes(
        &self,
        upstream: &str,
        notes: &[CullNote],
        now_ms: u64,
    ) -> Result<Vec<CullNote>, StoreError> {
        let entries = notes
            .iter()
            .map(|n| (n.backend.clone(), n.encode_value(), n.until_ms));
        let rows = self
            .publish_and_read(&self.notes_key(upstream), entries, now_ms)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(k, v)| CullNote::decode_entry(&k, &v))
            .filter(|n| n.until_ms > now_ms)
            .collect())
    }

    /// Publish `blamed` and read the upstream's blamed keys still in force at `now_ms`, in
    /// one round trip.
    pub(super) async fn fleet_blame(
        &self,
        upstream: &str,
        blamed: &[FleetBlame],
        now_ms: u64,
    ) -> Result<Vec<FleetBlame>, StoreError> {
        let entries = blamed
            .iter()
            .map(|b| (b.encode_field(), b.encode_value(), b.until_ms));
        let rows = self
            .publish_and_read(&self.blame_key(upstream), entries, now_ms)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(k, v)| FleetBlame::decode_entry(&k, &v))
            .filter(|b| b.until_ms > now_ms)
            .collect())
    }

    /// Write `entries` (field, value, until Unix ms) into the hash `key` and read the whole
    /// hash back, in one round trip. Every publisher's entries last until their `until`, so
    /// the hash expires with the last one written (the newest ends last); readers drop
    /// what is past.
    async fn publish_and_read(
        &self,
        key: &str,
        entries: impl Iterator<Item = (String, String, u64)>,
        now_ms: u64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut pipe = redis::pipe();
        let mut last = None;
        for (field, value, until) in entries {
            pipe.cmd("HSET").arg(key).arg(field).arg(value).ignore();
            last = last.max(Some(until));
        }
        if let Some(last) = last {
            pipe.cmd("PEXPIRE")
                .arg(key)
                .arg(last.saturating_sub(now_ms).max(1))
                .ignore();
        }
        pipe.cmd("HGETALL").arg(key);
        let (rows,): (Vec<(String, String)>,) = self
            .client
            .run(|mut c| async move { pipe.query_async(&mut c).await })
            .await?;
        Ok(rows)
    }

    /// Key of one backend's fleet error bucket.
    pub fn errors_key(&self, upstream: &str, backend: &str, bucket: u64) -> String {
        format!(
            "{p}:cull:{{{p}}}:err:{upstream}:{backend}:{bucket}",
            p = self.client.prefix()
        )
    }

    /// Add this instance's deltas to the current bucket and read the fleet's
    /// `(requests, errors)` per backend over the window, in one round trip.
    pub(super) async fn fleet_errors(
        &self,
        upstream: &str,
        deltas: &[FleetDelta],
        now_secs: u64,
        buckets: Buckets,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        let cur = now_secs / buckets.bucket_secs;
        let mut pipe = redis::pipe();
        let mut reads = Vec::with_capacity(deltas.len());
        for d in deltas {
            if d.requests > 0 || d.errors > 0 {
                let key = self.errors_key(upstream, &d.backend, cur);
                pipe.cmd("HINCRBY")
                    .arg(&key)
                    .arg("r")
                    .arg(d.requests)
                    .ignore();
                pipe.cmd("HINCRBY")
                    .arg(&key)
                    .arg("e")
                    .arg(d.errors)
                    .ignore();
                pipe.cmd("EXPIRE")
                    .arg(&key)
                    .arg(buckets.ttl_secs())
                    .ignore();
            }
            let range = buckets.to_read(now_secs, d.since_secs);
            let mut n = 0usize;
            for b in range {
                pipe.cmd("HMGET")
                    .arg(self.errors_key(upstream, &d.backend, b))
                    .arg("r")
                    .arg("e");
                n += 1;
            }
            reads.push(n);
        }
        if reads.iter().all(|&n| n == 0) {
            return Ok(vec![(0, 0); deltas.len()]);
        }
        let rows: Vec<(Option<u64>, Option<u64>)> = self
            .client
            .run(|mut c| async move { pipe.query_async(&mut c).await })
            .await?;
        let mut rows = rows.into_iter();
        Ok(reads
            .iter()
            .map(|&n| {
                rows.by_ref()
                    .take(n)
                    .fold((0u64, 0u64), |(r, e), (dr, de)| {
                        (r + dr.unwrap_or(0), e + de.unwrap_or(0))
                    })
            })
            .collect())
    }
}

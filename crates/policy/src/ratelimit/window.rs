//! Pure sliding-window arithmetic (no state, no clock): [`Sliding`] holds a key's counts
//! at one instant.
//!
//! Time is split into fixed windows of `w` milliseconds aligned to the Unix epoch; window
//! index `now_ms / w`, elapsed `e = now_ms % w`. With `prev` admissions in the previous
//! window and `cur` in the current one the estimate is
//! `prev * (1 - e/w) + cur`, and a request is admitted iff `estimate + 1 <= limit`.
//! Everything is computed exactly in integers scaled by `w`:
//! `prev * (w - e) + (cur + 1) * w <= limit * w`.

/// A key's sliding-window counts at one instant: `prev` and `cur` admissions in the
/// previous and current fixed window, windows of `w` ms, `e` ms (`< w`) elapsed in the
/// current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sliding {
    /// Admissions in the previous window.
    pub prev: u64,
    /// Admissions in the current window.
    pub cur: u64,
    /// Window length (ms, >= 1).
    pub w: u64,
    /// Elapsed ms in the current window.
    pub e: u64,
}

impl Sliding {
    /// Whether one more request is admitted under `limit`.
    #[inline]
    pub fn admits(&self, limit: u64) -> bool {
        let Self { prev, cur, w, e } = *self;
        let w = u128::from(w);
        let lhs = u128::from(prev) * (w - u128::from(e)) + (u128::from(cur) + 1) * w;
        lhs <= u128::from(limit) * w
    }

    /// Whole requests still admissible right now: `floor(limit - estimate)`, at least 0.
    #[inline]
    pub fn remaining(&self, limit: u64) -> u64 {
        let Self { prev, cur, w, e } = *self;
        let w128 = u128::from(w);
        let used = u128::from(prev) * (w128 - u128::from(e)) + u128::from(cur) * w128;
        let cap = u128::from(limit) * w128;
        if used >= cap {
            0
        } else {
            u64::try_from((cap - used) / w128).unwrap_or(u64::MAX)
        }
    }

    /// Smallest `d` (ms, possibly 0) such that a request at `now + d` is admitted under
    /// `limit`, assuming no further admissions. The estimate never increases with time, so
    /// every instant after `now + d` admits as well. A limit of 0 never admits; it returns
    /// one full window.
    pub fn retry_after_ms(&self, limit: u64) -> u64 {
        let Self { prev, cur, w, e } = *self;
        if limit == 0 {
            return w;
        }
        // Still within the current window?
        if cur < limit {
            let budget = limit - cur - 1; // allowed value of prev * (w - e') / w
            match earliest_elapsed(prev, budget, w) {
                Some(need) if need <= e => return 0,
                Some(need) => return need - e,
                None => {}
            }
        }
        // Next window: `cur` becomes the previous window, the current one is empty.
        let to_next = w - e;
        match earliest_elapsed(cur, limit - 1, w) {
            Some(need) => to_next + need,
            // Only the window after next (both counts empty) admits.
            None => to_next + w,
        }
    }

    /// Milliseconds until the estimate drains to zero (the quota is fully restored).
    pub fn drain_ms(&self) -> u64 {
        let Self { prev, cur, w, e } = *self;
        if cur > 0 {
            2 * w - e
        } else if prev > 0 {
            w - e
        } else {
            0
        }
    }
}

/// Whether one more admission fits this instance's share of what the fleet has left, with
/// `n` instances deciding independently between syncs.
///
/// `global`: the fleet's counts as last known (may include an estimate of admissions not
/// seen yet), with the instant (`w`, `e`); `own = (prev, cur)`: this instance's admissions
/// not included in them. The fleet has `R = limit - estimate(global)` left; this
/// instance's share is `S = floor(R / n)` whole requests plus one more with probability
/// `frac(R / n)` (0 when `R < 1`), so the shares of the `n` instances add up to `R` in
/// expectation (rounding every share up, as before, let `n` instances admit `R + n - 1`).
/// One more is admitted iff `estimate(own) + 1 <= S`. `draw` gives the chance of the extra
/// request: uniform over `u64`, drawn per instance and key and held between two syncs
/// ([`share_draw`]); the extra request is granted iff `draw < frac(R / n) * 2^64`. It is
/// called only when the extra request decides (`own` has used `floor(R / n)`, not more).
/// With `n = 1` there is no rounding (`S = R`): this is exactly [`Sliding::admits`] on the
/// summed counts; with `n >= 2` it admits nothing [`Sliding::admits`] would refuse, whatever
/// the draw (`S <= ceil(R / n) <= R`).
#[inline]
pub fn within_share(
    global: Sliding,
    own: (u64, u64),
    limit: u64,
    n: u64,
    draw: impl FnOnce() -> u64,
) -> bool {
    let w = u128::from(global.w);
    let a = w - u128::from(global.e);
    let cap = u128::from(limit) * w;
    let used = u128::from(global.prev) * a + u128::from(global.cur) * w;
    if used + w > cap {
        return false; // R < 1: no share
    }
    let need = u128::from(own.0) * a + (u128::from(own.1) + 1) * w;
    let left = cap - used; // R * w
    if n <= 1 {
        return need <= left;
    }
    // R / n = q + rem / d, in units of `w`.
    let d = u128::from(n) * w;
    let (q, rem) = (left / d, left % d);
    let whole = q * w;
    if need <= whole {
        return true; // within floor(R / n): no draw needed
    }
    if rem == 0 || need > whole + w {
        return false;
    }
    // The extra request, with probability rem / d: draw * d / 2^64 < rem (one 64 x 64-bit
    // product: `d` = n x window ms fits 64 bits for any real fleet).
    let draw = draw();
    match u64::try_from(d) {
        Ok(d) => (u128::from(draw) * u128::from(d)) >> 64 < rem,
        Err(_) => u128::from(draw) % d < rem,
    }
}

/// The draw of [`within_share`] for one key on one instance: a hash of `seed` (a
/// per-instance, per-key value: the key's process-local id, random per limiter), the window
/// index and `view` (what the last sync told: it changes at each sync that brings news, not
/// between two syncs, so repeating a request between syncs does not redraw the extra).
/// Draws of different instances are independent.
#[inline]
pub fn share_draw(seed: u64, window: u64, view: u64) -> u64 {
    // splitmix64's finalizer over the three inputs.
    let mut z = seed
        ^ window.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ view.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Earliest elapsed offset `e' in [0, w)` with `prev * (w - e') <= budget * w`, if any.
fn earliest_elapsed(prev: u64, budget: u64, w: u64) -> Option<u64> {
    if prev == 0 {
        return Some(0);
    }
    let max_rem = u128::from(budget) * u128::from(w) / u128::from(prev); // max allowed (w - e')
    if max_rem >= u128::from(w) {
        return Some(0);
    }
    // max_rem < w fits in u64
    let need = w - u64::try_from(max_rem).unwrap_or(w);
    if need < w {
        Some(need)
    } else {
        None
    }
}

/// Whole seconds, rounded up.
#[inline]
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const W: u64 = 60_000;

    // The cases below read as (prev, cur, limit, w, e).
    fn admits(prev: u64, cur: u64, limit: u64, w: u64, e: u64) -> bool {
        Sliding { prev, cur, w, e }.admits(limit)
    }
    fn remaining(prev: u64, cur: u64, limit: u64, w: u64, e: u64) -> u64 {
        Sliding { prev, cur, w, e }.remaining(limit)
    }
    fn retry_after_ms(prev: u64, cur: u64, limit: u64, w: u64, e: u64) -> u64 {
        Sliding { prev, cur, w, e }.retry_after_ms(limit)
    }
    fn drain_ms(prev: u64, cur: u64, w: u64, e: u64) -> u64 {
        Sliding { prev, cur, w, e }.drain_ms()
    }
    /// With the draw 0: every share that has a remainder gets its extra request.
    fn within_share(
        (prev, cur): (u64, u64),
        own: (u64, u64),
        limit: u64,
        n: u64,
        w: u64,
        e: u64,
    ) -> bool {
        super::within_share(Sliding { prev, cur, w, e }, own, limit, n, || 0)
    }
    /// With the largest draw: no share gets its extra request.
    fn within_floor_share(
        (prev, cur): (u64, u64),
        own: (u64, u64),
        limit: u64,
        n: u64,
        w: u64,
        e: u64,
    ) -> bool {
        super::within_share(Sliding { prev, cur, w, e }, own, limit, n, || u64::MAX)
    }

    /// Brute force: scan forward ms by ms (for small cases) for the first admitting instant.
    fn brute_retry(prev: u64, cur: u64, limit: u64, w: u64, e: u64) -> u64 {
        for d in 0..=(3 * w) {
            let t = e + d;
            let ok = if t < w {
                admits(prev, cur, limit, w, t)
            } else if t < 2 * w {
                admits(cur, 0, limit, w, t - w)
            } else {
                admits(0, 0, limit, w, t - 2 * w)
            };
            if ok {
                return d;
            }
        }
        u64::MAX
    }

    #[test]
    fn admit_at_boundaries() {
        // Start of a window: previous counts fully.
        assert!(!admits(10, 0, 10, W, 0));
        assert!(admits(9, 0, 10, W, 0));
        // Mid window: half of prev counts. 10*0.5 + 4 + 1 = 10 <= 10.
        assert!(admits(10, 4, 10, W, 30_000));
        assert!(!admits(10, 5, 10, W, 30_000));
        // End of window: prev weight 1/60000.
        assert!(admits(10, 8, 10, W, W - 1)); // 10/60000 + 9 <= 10
        assert!(!admits(10, 9, 10, W, W - 1)); // 10/60000 + 10 > 10
                                               // Exact equality is admitted.
        assert!(admits(0, 9, 10, W, 0));
        assert!(!admits(0, 10, 10, W, 0));
        // limit 0 never admits
        assert!(!admits(0, 0, 0, W, 0));
    }

    #[test]
    fn remaining_is_floor() {
        assert_eq!(remaining(0, 0, 10, W, 0), 10);
        assert_eq!(remaining(10, 0, 10, W, 30_000), 5);
        assert_eq!(remaining(10, 0, 10, W, 30_001), 5);
        assert_eq!(remaining(10, 0, 10, W, 29_999), 4);
        assert_eq!(remaining(20, 20, 10, W, 0), 0);
    }

    #[test]
    fn retry_after_exact_examples() {
        // limit 10, window 60s, 10 admitted at the very start of a window: only the next
        // window frees a slot, once the 10 have decayed to <= 9: e'' >= 6000 ms.
        assert_eq!(retry_after_ms(0, 10, 10, W, 0), W + 6_000);
        // Same but 10 s into the window.
        assert_eq!(retry_after_ms(0, 10, 10, W, 10_000), 50_000 + 6_000);
        // prev 10, cur 5, at 30 s: 5 + 5 = 10 -> need 10*(1-f) <= 4 -> f >= 0.6 -> 36 s.
        assert_eq!(retry_after_ms(10, 5, 10, W, 30_000), 6_000);
        // limit 1: cur 1 must be fully gone -> window after next.
        assert_eq!(retry_after_ms(0, 1, 1, W, 1_000), 59_000 + W);
        // admitted now -> 0
        assert_eq!(retry_after_ms(0, 0, 10, W, 123), 0);
        assert_eq!(retry_after_ms(5, 0, 1, 1_000, 0), 1_000);
    }

    /// Calls `f` with every combination of one value per axis, the first axis outermost.
    fn grid<const N: usize>(axes: [&[u64]; N], mut f: impl FnMut([u64; N])) {
        if axes.iter().any(|a| a.is_empty()) {
            return;
        }
        let mut at = [0usize; N];
        loop {
            f(std::array::from_fn(|i| axes[i][at[i]]));
            // the next combination, as an odometer turns
            let mut i = N;
            loop {
                if i == 0 {
                    return;
                }
                i -= 1;
                at[i] += 1;
                if at[i] < axes[i].len() {
                    break;
                }
                at[i] = 0;
            }
        }
    }

    /// `from..to` as an axis of [`grid`].
    fn axis(from: u64, to: u64) -> Vec<u64> {
        (from..to).collect()
    }

    #[test]
    fn grid_visits_every_combination_once_in_order() {
        let mut seen = Vec::new();
        grid([&axis(0, 2), &[7, 8, 9]], |c| seen.push(c));
        assert_eq!(seen, [[0, 7], [0, 8], [0, 9], [1, 7], [1, 8], [1, 9]]);
        grid([&axis(0, 2), &[]], |c| panic!("{c:?} from an empty axis"));
    }

    #[test]
    fn retry_after_matches_brute_force() {
        let w = 1_000;
        let es = [0u64, 1, 250, 499, 500, 777, 998, 999];
        grid(
            [&axis(1, 6), &axis(0, 12), &axis(0, 12), &es],
            |[limit, prev, cur, e]| {
                let got = retry_after_ms(prev, cur, limit, w, e);
                assert_eq!(
                    got,
                    brute_retry(prev, cur, limit, w, e),
                    "prev {prev} cur {cur} limit {limit} e {e}"
                );
            },
        );
    }

    #[test]
    fn share_examples() {
        // New key, 2 instances, limit 200: 100 each.
        assert!(within_share((0, 0), (0, 99), 200, 2, W, 0));
        assert!(!within_share((0, 0), (0, 100), 200, 2, W, 0));
        // A remainder is granted by the draw: the smallest draw grants it (limit 201 -> 101
        // each; 3 left -> 2 each; 1 left -> 1 each), the largest never (100 each; 1 each;
        // nothing).
        assert!(within_share((0, 0), (0, 100), 201, 2, W, 0));
        assert!(!within_floor_share((0, 0), (0, 100), 201, 2, W, 0));
        assert!(within_floor_share((0, 0), (0, 99), 201, 2, W, 0));
        assert!(within_share((0, 198), (0, 1), 201, 2, W, 0));
        assert!(!within_floor_share((0, 198), (0, 1), 201, 2, W, 0));
        assert!(within_floor_share((0, 198), (0, 0), 201, 2, W, 0));
        assert!(!within_share((0, 198), (0, 2), 201, 2, W, 0));
        assert!(within_share((0, 199), (0, 0), 200, 8, W, 0));
        assert!(!within_floor_share((0, 199), (0, 0), 200, 8, W, 0));
        // One instance: no rounding at all, the share is what is left, fractions included
        // (3/4 into the window: 2.5 left, own 1 x 1/4 + 1 fits; at 1/4: 1.5 left, 3/4 + 1
        // does not).
        assert!(within_floor_share((0, 198), (0, 1), 200, 1, W, 0));
        assert!(within_floor_share((2, 197), (1, 0), 200, 1, W, W / 4 * 3));
        assert!(!within_floor_share((2, 197), (1, 0), 200, 1, W, W / 4));
        // Nothing left (R < 1): no share at all.
        assert!(!within_share((0, 200), (0, 0), 200, 2, W, 0));
        assert!(!within_share((1, 199), (0, 0), 200, 2, W, W / 2));
        // Previous window weighs by the elapsed fraction, own and global alike:
        // R = 200 - 100 * 0.5 = 150 -> 75 each; own 20 * 0.5 + 64 + 1 = 75.
        assert!(within_share((100, 0), (20, 64), 200, 2, W, W / 2));
        assert!(!within_share((100, 0), (20, 65), 200, 2, W, W / 2));
        // limit 0: nothing.
        assert!(!within_share((0, 0), (0, 0), 0, 2, W, 0));
    }

    #[test]
    fn share_remainder_is_granted_with_its_probability() {
        // R / n = 600 / 1,000, 1,300 / 1,000 and 7 / 3 (R = limit - 50, 50 in the current
        // window), over draws spread evenly over u64: every draw grants floor(R / n), the
        // extra request goes to the fraction frac(R / n) of them, nothing more to any: n
        // instances' shares add up to R in expectation.
        let draws = 100_000u64;
        let step = u64::MAX / draws;
        for (left, n, whole) in [(600u64, 1_000u64, 0u64), (1_300, 1_000, 1), (7, 3, 2)] {
            let limit = left + 50;
            let mut extra = 0u64;
            for k in 0..draws {
                let g = Sliding {
                    prev: 0,
                    cur: 50,
                    w: W,
                    e: 0,
                };
                let d = k * step;
                let share = |own| super::within_share(g, (0, own), limit, n, || d);
                assert!(whole == 0 || share(whole - 1));
                extra += u64::from(share(whole));
                assert!(!share(whole + 1));
            }
            let expect = (left % n) as f64 / n as f64;
            let got = extra as f64 / draws as f64;
            assert!((got - expect).abs() < 1e-3, "{left}/{n}: {got} vs {expect}");
        }
        // The draw of an instance holds between syncs (same inputs, same draw), and
        // differs between instances, windows and views.
        assert_eq!(share_draw(1, 2, 3), share_draw(1, 2, 3));
        let d = share_draw(1, 2, 3);
        assert!([
            share_draw(9, 2, 3),
            share_draw(1, 9, 3),
            share_draw(1, 2, 9)
        ]
        .iter()
        .all(|&x| x != d));
    }

    #[test]
    fn share_is_consistent_with_admits() {
        // n = 1: the share is exactly `admits` (so it can be skipped);
        // n >= 2: the share admits nothing `admits` would refuse, whatever the draw.
        let w = 1_000;
        let es = [0u64, 1, 250, 500, 999];
        let axes: [&[u64]; 6] = [
            &axis(0, 8),
            &axis(0, 6),
            &axis(0, 6),
            &axis(0, 4),
            &axis(0, 4),
            &es,
        ];
        grid(axes, |[limit, gp, gc, op, oc, e]| {
            let a = admits(gp + op, gc + oc, limit, w, e);
            let case = format!("{gp} {gc} {op} {oc} {limit} {e}");
            let g = Sliding {
                prev: gp,
                cur: gc,
                w,
                e,
            };
            for draw in [0, 1 << 63, u64::MAX] {
                let share = |n| super::within_share(g, (op, oc), limit, n, || draw);
                assert_eq!(share(1), a, "draw {draw}: {case}");
                for n in 2..5 {
                    if share(n) {
                        assert!(a, "n {n}, draw {draw}: {case}");
                    }
                }
            }
        });
    }

    #[test]
    fn drain_and_ceil() {
        assert_eq!(drain_ms(0, 0, W, 5), 0);
        assert_eq!(drain_ms(3, 0, W, 10_000), 50_000);
        assert_eq!(drain_ms(3, 1, W, 10_000), 110_000);
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1000), 1);
        assert_eq!(ceil_secs(1001), 2);
    }
}

//! Load balancing, the step between route match and forward: picks one
//! available target of an upstream pool for a request.

use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::HeaderMap;
use sluice_proto::v1;

/// Virtual nodes per unit of weight on the consistent-hash ring: enough for
/// an even spread over a handful of targets, small enough to build quickly.
const RING_POINTS_PER_WEIGHT: u32 = 100;

/// What a balancer may look at in a request.
pub struct PickContext<'a> {
    pub client_ip: Option<IpAddr>,
    pub headers: &'a HeaderMap,
}

/// The view of the targets a balancer needs; `available` folds in health and ejection.
pub trait Candidates {
    fn len(&self) -> usize;
    fn available(&self, i: usize) -> bool;
    fn weight(&self, i: usize) -> u32;
    fn in_flight(&self, i: usize) -> usize;
}

#[derive(Debug)]
pub enum Balancer {
    RoundRobin {
        next: AtomicUsize,
    },
    /// nginx's smooth weighted round robin: spreads a heavy target's turns
    /// between the others instead of sending them in a burst.
    WeightedRoundRobin {
        current: Mutex<Vec<i64>>,
    },
    LeastConnections {
        next: AtomicUsize,
    },
    RandomTwoChoices,
    ConsistentHash {
        ring: Vec<(u64, usize)>,
        on: HashOn,
        fallback: AtomicUsize,
    },
}

#[derive(Debug, Clone)]
pub enum HashOn {
    ClientIp,
    Header(http::HeaderName),
    Cookie(String),
}

impl Balancer {
    /// Builds the balancer for an upstream; `urls` and `weights` are per target.
    pub fn new(upstream: &v1::Upstream, urls: &[&str], weights: &[u32]) -> Result<Self, String> {
        Ok(match upstream.balance() {
            v1::Balance::RoundRobin => Balancer::RoundRobin { next: AtomicUsize::new(0) },
            v1::Balance::WeightedRoundRobin => {
                Balancer::WeightedRoundRobin { current: Mutex::new(vec![0; urls.len()]) }
            }
            v1::Balance::LeastConnections => Balancer::LeastConnections { next: AtomicUsize::new(0) },
            v1::Balance::RandomTwoChoices => Balancer::RandomTwoChoices,
            v1::Balance::ConsistentHash => {
                let hash_on = upstream.hash_on.clone().unwrap_or_default();
                let on = match hash_on.source() {
                    v1::HashSource::ClientIp => HashOn::ClientIp,
                    v1::HashSource::Header => HashOn::Header(
                        http::HeaderName::from_bytes(hash_on.name.as_bytes())
                            .map_err(|_| format!("`{}` is not a valid header name", hash_on.name))?,
                    ),
                    v1::HashSource::Cookie => HashOn::Cookie(hash_on.name.clone()),
                };
                Balancer::ConsistentHash { ring: build_ring(urls, weights), on, fallback: AtomicUsize::new(0) }
            }
        })
    }

    /// The header field a pick reads, if any.
    pub fn hashed_header(&self) -> Option<&http::HeaderName> {
        match self {
            Balancer::ConsistentHash { on: HashOn::Header(name), .. } => Some(name),
            _ => None,
        }
    }

    /// Whether a pick reads the request's header fields (a header or a cookie).
    pub fn reads_request_fields(&self) -> bool {
        matches!(self, Balancer::ConsistentHash { on: HashOn::Header(_) | HashOn::Cookie(_), .. })
    }

    /// Returns the index of the chosen target, or `None` when none is
    /// available. A `retry` takes no turn of a round robin (see `UpstreamPool::pick`).
    pub fn pick(&self, targets: &impl Candidates, ctx: &PickContext<'_>, retry: bool) -> Option<usize> {
        let n = targets.len();
        if n == 0 {
            return None;
        }
        match self {
            Balancer::RoundRobin { next } => round_robin(next, targets, retry),
            Balancer::WeightedRoundRobin { current } => {
                let mut current = current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                current.resize(n, 0);
                let mut total = 0i64;
                let mut best: Option<usize> = None;
                for i in (0..n).filter(|i| targets.available(*i)) {
                    let w = i64::from(targets.weight(i));
                    current[i] += w;
                    total += w;
                    if best.is_none_or(|b| current[i] > current[b]) {
                        best = Some(i);
                    }
                }
                let best = best?;
                current[best] -= total;
                Some(best)
            }
            Balancer::LeastConnections { next } => {
                // Start the scan at a rotating offset so ties spread evenly.
                let start = next.fetch_add(1, Ordering::Relaxed);
                (0..n)
                    .map(|k| (start + k) % n)
                    .filter(|i| targets.available(*i))
                    .min_by_key(|i| targets.in_flight(*i) * 1000 / targets.weight(*i).max(1) as usize)
            }
            Balancer::RandomTwoChoices => {
                let available: Vec<usize> = (0..n).filter(|i| targets.available(*i)).collect();
                match available.len() {
                    0 => None,
                    1 => Some(available[0]),
                    len => {
                        let a = rand::random_range(0..len);
                        let mut b = rand::random_range(0..len - 1);
                        if b >= a {
                            b += 1;
                        }
                        let (a, b) = (available[a], available[b]);
                        Some(if targets.in_flight(b) < targets.in_flight(a) { b } else { a })
                    }
                }
            }
            Balancer::ConsistentHash { ring, on, fallback } => match hash_key(on, ctx) {
                Some(key) => ring_lookup(ring, key, targets),
                // No key to hash on (header absent): spread such requests evenly.
                None => round_robin(fallback, targets, retry),
            },
        }
    }
}

/// Counts turns over the available targets only: skipping a down target to
/// its neighbour would give that neighbour a double share.
fn round_robin(next: &AtomicUsize, targets: &impl Candidates, retry: bool) -> Option<usize> {
    let available = (0..targets.len()).filter(|i| targets.available(*i)).count();
    if available == 0 {
        return None;
    }
    let turn = if retry { next.load(Ordering::Relaxed) } else { next.fetch_add(1, Ordering::Relaxed) } % available;
    (0..targets.len()).filter(|i| targets.available(*i)).nth(turn)
}

fn hash_key(on: &HashOn, ctx: &PickContext<'_>) -> Option<u64> {
    match on {
        HashOn::ClientIp => ctx.client_ip.map(|ip| hash64(ip.to_string().as_bytes())),
        HashOn::Header(name) => ctx.headers.get(name).map(|v| hash64(v.as_bytes())),
        HashOn::Cookie(name) => ctx
            .headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name.as_str())
            .map(|(_, v)| hash64(v.as_bytes())),
    }
}

fn build_ring(urls: &[&str], weights: &[u32]) -> Vec<(u64, usize)> {
    let mut ring = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        let points = weights.get(i).copied().unwrap_or(1).max(1) * RING_POINTS_PER_WEIGHT;
        for p in 0..points {
            ring.push((hash64(format!("{url}#{p}").as_bytes()), i));
        }
    }
    ring.sort_unstable();
    ring
}

/// The first available target clockwise from the key, so a target's failure
/// only moves its own keys.
fn ring_lookup(ring: &[(u64, usize)], key: u64, targets: &impl Candidates) -> Option<usize> {
    if ring.is_empty() {
        return None;
    }
    let start = ring.partition_point(|(h, _)| *h < key);
    (0..ring.len()).map(|k| ring[(start + k) % ring.len()].1).find(|i| targets.available(*i))
}

/// FNV-1a followed by the splitmix64 finalizer: stable across processes and
/// versions (every data plane must place a key on the same target), cheap,
/// and well spread even for similar inputs like `url#1`, `url#2`.
pub fn hash64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        up: Vec<bool>,
        weights: Vec<u32>,
        in_flight: Vec<usize>,
    }

    impl Candidates for Fake {
        fn len(&self) -> usize {
            self.up.len()
        }
        fn available(&self, i: usize) -> bool {
            self.up[i]
        }
        fn weight(&self, i: usize) -> u32 {
            self.weights[i]
        }
        fn in_flight(&self, i: usize) -> usize {
            self.in_flight[i]
        }
    }

    fn upstream(balance: v1::Balance, hash_on: Option<v1::HashOn>) -> v1::Upstream {
        let mut u = v1::Upstream { hash_on, ..Default::default() };
        u.set_balance(balance);
        u
    }

    fn counts(b: &Balancer, t: &Fake, n: usize, headers: &HeaderMap) -> Vec<usize> {
        let mut c = vec![0; t.len()];
        for i in 0..n {
            let ip: IpAddr = format!("10.0.{}.{}", i / 250, i % 250).parse().unwrap();
            let ctx = PickContext { client_ip: Some(ip), headers };
            c[b.pick(t, &ctx, false).unwrap()] += 1;
        }
        c
    }

    #[test]
    fn spreads_table() {
        let urls = ["http://a", "http://b", "http://c"];
        let h = HeaderMap::new();
        // (balance, up, weights, in_flight, expected counts over 600 picks, tolerance)
        type Case = (v1::Balance, [bool; 3], [u32; 3], [usize; 3], [usize; 3], usize);
        let cases: Vec<Case> = vec![
            (v1::Balance::RoundRobin, [true; 3], [1; 3], [0; 3], [200, 200, 200], 0),
            (v1::Balance::RoundRobin, [true, false, true], [1; 3], [0; 3], [300, 0, 300], 0),
            (v1::Balance::WeightedRoundRobin, [true; 3], [1, 2, 3], [0; 3], [100, 200, 300], 0),
            (v1::Balance::WeightedRoundRobin, [false, true, true], [1, 1, 2], [0; 3], [0, 200, 400], 0),
            (v1::Balance::LeastConnections, [true; 3], [1; 3], [5, 0, 5], [0, 600, 0], 0),
            (v1::Balance::RandomTwoChoices, [true; 3], [1; 3], [9, 9, 0], [0, 0, 600], 600),
            (v1::Balance::ConsistentHash, [true; 3], [1; 3], [0; 3], [200, 200, 200], 90),
        ];
        for (balance, up, weights, in_flight, want, tolerance) in cases {
            let b = Balancer::new(&upstream(balance, None), &urls, &weights).unwrap();
            let t = Fake { up: up.to_vec(), weights: weights.to_vec(), in_flight: in_flight.to_vec() };
            let got = counts(&b, &t, 600, &h);
            for i in 0..3 {
                assert!(got[i].abs_diff(want[i]) <= tolerance, "{balance:?}: got {got:?}, want {want:?}");
            }
            if balance == v1::Balance::RandomTwoChoices {
                // The idle target wins every pair it is in, so it must get the most.
                assert!(got[2] > got[0] && got[2] > got[1], "{got:?}");
            }
        }
    }

    #[test]
    fn smooth_weighted_interleaves() {
        let u = upstream(v1::Balance::WeightedRoundRobin, None);
        let b = Balancer::new(&u, &["a", "b", "c"], &[5, 1, 1]).unwrap();
        let t = Fake { up: vec![true; 3], weights: vec![5, 1, 1], in_flight: vec![0; 3] };
        let h = HeaderMap::new();
        let ctx = PickContext { client_ip: None, headers: &h };
        let seq: Vec<usize> = (0..7).map(|_| b.pick(&t, &ctx, false).unwrap()).collect();
        assert_eq!(seq, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn none_available() {
        let h = HeaderMap::new();
        let ctx = PickContext { client_ip: None, headers: &h };
        let t = Fake { up: vec![false; 2], weights: vec![1; 2], in_flight: vec![0; 2] };
        for balance in [
            v1::Balance::RoundRobin,
            v1::Balance::WeightedRoundRobin,
            v1::Balance::LeastConnections,
            v1::Balance::RandomTwoChoices,
            v1::Balance::ConsistentHash,
        ] {
            let b = Balancer::new(&upstream(balance, None), &["a", "b"], &[1, 1]).unwrap();
            assert_eq!(b.pick(&t, &ctx, false), None, "{balance:?}");
        }
    }

    #[test]
    fn consistent_hash_is_sticky_and_moves_only_failed_keys() {
        let on = |source: v1::HashSource, name: &str| {
            let mut h = v1::HashOn { name: name.into(), ..Default::default() };
            h.set_source(source);
            Some(h)
        };
        let mut headers = HeaderMap::new();
        headers.insert("x-user", "alice".parse().unwrap());
        headers.insert(http::header::COOKIE, "a=1; session=xyz".parse().unwrap());
        for hash_on in [on(v1::HashSource::Header, "x-user"), on(v1::HashSource::Cookie, "session")] {
            let b = Balancer::new(&upstream(v1::Balance::ConsistentHash, hash_on), &["a", "b", "c"], &[1; 3]).unwrap();
            let mut t = Fake { up: vec![true; 3], weights: vec![1; 3], in_flight: vec![0; 3] };
            let ctx = PickContext { client_ip: None, headers: &headers };
            let first = b.pick(&t, &ctx, false).unwrap();
            assert!((0..10).all(|_| b.pick(&t, &ctx, false) == Some(first)));
            t.up[first] = false;
            let moved = b.pick(&t, &ctx, false).unwrap();
            assert_ne!(moved, first);
        }
        // Keys on other targets stay put when one target goes down.
        let b = Balancer::new(&upstream(v1::Balance::ConsistentHash, None), &["a", "b", "c"], &[1; 3]).unwrap();
        let mut t = Fake { up: vec![true; 3], weights: vec![1; 3], in_flight: vec![0; 3] };
        let pick_ip = |t: &Fake, i: u8| {
            let ctx = PickContext { client_ip: Some(IpAddr::from([10, 0, 0, i])), headers: &headers };
            b.pick(t, &ctx, false).unwrap()
        };
        let before: Vec<usize> = (0..100).map(|i| pick_ip(&t, i)).collect();
        t.up[1] = false;
        for i in 0..100u8 {
            if before[i as usize] != 1 {
                assert_eq!(pick_ip(&t, i), before[i as usize]);
            }
        }
    }
}

//! The hash map for lookups on the request path whose keys no client chooses:
//! keys from the configuration (route segments, hosts, consumer names), which
//! clients only look up, or keyed digests of what clients send (the basic-auth
//! login cache, API-key digests). foldhash is several times cheaper than the
//! default SipHash on short keys, and its seed is still random per process.

pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

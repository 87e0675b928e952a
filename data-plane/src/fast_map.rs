//! The hash map for lookups on the request path whose keys come from the
//! configuration (route segments, hosts, consumer names): foldhash is several
//! times cheaper than the default SipHash on short keys. Its seed is still
//! random per process, and clients only look keys up, never insert them.

pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

//! Who the client is, for IP-keyed rate limits: the socket peer, unless the
//! peer is a trusted proxy, in which case `X-Forwarded-For` is read from the
//! right (nearest hop) to the first address no trusted proxy vouches for.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;

const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// An address range such as `10.0.0.0/8` or `2001:db8::/32`; a bare address
/// is a single host. Used for `--trusted-proxies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("`{0}` is not an IP address or CIDR range")]
    Address(String),
    #[error("`{0}` has a prefix length longer than the address")]
    Prefix(String),
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask_v4(u32::from(ip), self.prefix) == u32::from(net),
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask_v6(u128::from(ip), self.prefix) == u128::from(net),
            _ => false,
        }
    }
}

fn mask_v4(bits: u32, prefix: u8) -> u32 {
    // A shift by the full width overflows; /0 is "every address".
    if prefix == 0 { 0 } else { bits & (u32::MAX << (32 - u32::from(prefix))) }
}

fn mask_v6(bits: u128, prefix: u8) -> u128 {
    if prefix == 0 { 0 } else { bits & (u128::MAX << (128 - u32::from(prefix))) }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| CidrError::Address(text.to_owned()))?;
        // IPv4-mapped IPv6 peers are canonicalised before matching, so ranges
        // are too: `::ffff:10.0.0.0/104` means `10.0.0.0/8`.
        let (addr, offset) = match (addr, addr.to_canonical()) {
            (IpAddr::V6(_), v4 @ IpAddr::V4(_)) => (v4, 96u8),
            (addr, _) => (addr, 0),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => {
                let p: u8 = p.parse().map_err(|_| CidrError::Address(text.to_owned()))?;
                let p = p.checked_sub(offset).ok_or_else(|| CidrError::Prefix(text.to_owned()))?;
                if p > max {
                    return Err(CidrError::Prefix(text.to_owned()));
                }
                p
            }
        };
        // Host bits are dropped so `10.1.2.3/8` matches like `10.0.0.0/8`.
        let network = match addr {
            IpAddr::V4(v4) => IpAddr::from(mask_v4(u32::from(v4), prefix).to_be_bytes()),
            IpAddr::V6(v6) => IpAddr::from(mask_v6(u128::from(v6), prefix).to_be_bytes()),
        };
        Ok(Cidr { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn is_trusted(ip: IpAddr, trusted: &[Cidr]) -> bool {
    trusted.iter().any(|cidr| cidr.contains(ip))
}

/// The address a request is attributed to. `X-Forwarded-For` is believed
/// only as far as trusted proxies wrote it: each trusted proxy appends the
/// address it received from, so walking from the right, the first address
/// that is not a trusted proxy is the client. Anything left of it was written
/// by the client and is ignored, so a client cannot pick its own bucket by
/// sending a forged header. A hop that does not parse ends the walk at the
/// last trusted address (which then keys the bucket) for the same reason.
pub fn effective_client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let mut client = peer.to_canonical();
    if !is_trusted(client, trusted) {
        return client;
    }
    // Several header lines form one list in order (RFC 9110 5.3), so the last
    // line holds the nearest hops.
    for value in headers.get_all(X_FORWARDED_FOR).iter().rev() {
        let Ok(text) = value.to_str() else { return client };
        for hop in text.rsplit(',') {
            let Some(ip) = parse_hop(hop) else { return client };
            client = ip;
            if !is_trusted(ip, trusted) {
                return client;
            }
        }
    }
    // Every hop was a trusted proxy: the left-most one is as close to the
    // client as the chain lets us see.
    client
}

/// An `X-Forwarded-For` entry: an address, sometimes with a port.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    hop.parse::<IpAddr>().ok().or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip())).map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn cidrs(list: &[&str]) -> Vec<Cidr> {
        list.iter().map(|c| c.parse().unwrap()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_parsing_and_matching() {
        let cases = [
            ("10.0.0.0/8", "10.200.1.1", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("10.1.2.3/8", "10.9.9.9", true),
            ("192.168.1.5", "192.168.1.5", true),
            ("192.168.1.5", "192.168.1.6", false),
            ("0.0.0.0/0", "8.8.8.8", true),
            ("0.0.0.0/0", "::1", false),
            ("2001:db8::/32", "2001:db8:1::1", true),
            ("2001:db8::/32", "2001:db9::1", false),
            ("::ffff:10.0.0.0/104", "10.3.3.3", true),
            ("10.0.0.0/8", "::ffff:10.1.1.1", true),
        ];
        for (cidr, addr, expected) in cases {
            let parsed: Cidr = cidr.parse().unwrap();
            assert_eq!(parsed.contains(ip(addr)), expected, "{cidr} contains {addr}");
        }
        for bad in ["", "10.0.0.0/33", "::/129", "nonsense", "10.0.0.0/x", "::ffff:10.0.0.0/8"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad} should not parse");
        }
        assert_eq!("10.1.2.3/8".parse::<Cidr>().unwrap().to_string(), "10.0.0.0/8");
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted = cidrs(&["10.0.0.0/8", "2001:db8::/32"]);
        // (peer, X-Forwarded-For lines, trusted list, expected client)
        let cases: [(&str, &[&str], &[Cidr], &str); 12] = [
            // No trusted proxies configured: the header is ignored.
            ("203.0.113.9", &["1.1.1.1"], &[], "203.0.113.9"),
            // Peer not trusted: a forged header is ignored.
            ("203.0.113.9", &["1.1.1.1"], &trusted, "203.0.113.9"),
            // Trusted peer, one hop.
            ("10.0.0.2", &["198.51.100.7"], &trusted, "198.51.100.7"),
            // Client-forged entries left of the real client are ignored.
            ("10.0.0.2", &["6.6.6.6, 198.51.100.7, 10.0.0.5"], &trusted, "198.51.100.7"),
            // Several header lines are one list; the last line is nearest.
            ("10.0.0.2", &["6.6.6.6", "198.51.100.7, 10.0.0.5"], &trusted, "198.51.100.7"),
            // Trusted peer without the header: the peer itself.
            ("10.0.0.2", &[], &trusted, "10.0.0.2"),
            // All hops trusted: the left-most.
            ("10.0.0.2", &["10.9.9.9, 10.0.0.5"], &trusted, "10.9.9.9"),
            // Garbage stops the walk at the last trusted hop.
            ("10.0.0.2", &["1.1.1.1, unknown, 10.0.0.5"], &trusted, "10.0.0.5"),
            ("10.0.0.2", &["1.1.1.1,"], &trusted, "10.0.0.2"),
            // Ports and IPv6 forms.
            ("10.0.0.2", &["198.51.100.7:4711"], &trusted, "198.51.100.7"),
            ("2001:db8::1", &["[2001:db9::7]:443"], &trusted, "2001:db9::7"),
            // An IPv4-mapped peer matches IPv4 ranges.
            ("::ffff:10.0.0.2", &["198.51.100.7"], &trusted, "198.51.100.7"),
        ];
        for (peer, lines, trusted, expected) in cases {
            let mut headers = HeaderMap::new();
            for line in lines {
                headers.append(X_FORWARDED_FOR, HeaderValue::from_str(line).unwrap());
            }
            assert_eq!(effective_client_ip(ip(peer), &headers, trusted), ip(expected), "{peer} {lines:?}");
        }
    }
}

//! Who the client is, for IP-keyed rate limits: the socket peer, unless the
//! peer is a trusted proxy, in which case `X-Forwarded-For` is read from the
//! right (nearest hop) to the first address no trusted proxy vouches for.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use sluice_proto::Cidr;

const X_FORWARDED_FOR: &str = "x-forwarded-for";

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

//! Address ranges, one parser for every list of them: an API's
//! `ip_restriction` allow and deny lists (checked by the control plane when
//! it validates a snapshot, compiled by the data plane) and a data plane's
//! `--trusted-proxies`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An address range such as `10.0.0.0/8` or `2001:db8::/32`; a bare address
/// is a single host. IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are the
/// IPv4 addresses they map, in ranges and in lookups alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("`{0}` is not an IP address or CIDR block")]
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

    /// The text exactly as given: a list that allows blanks trims its entries itself.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| CidrError::Address(text.to_owned()))?;
        // `::ffff:10.0.0.0/104` means `10.0.0.0/8`.
        let (addr, offset) = match (addr, addr.to_canonical()) {
            (IpAddr::V6(_), v4 @ IpAddr::V4(_)) => (v4, 96u8),
            (addr, _) => (addr, 0),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) => {
                return Err(CidrError::Address(text.to_owned()));
            }
            Some(p) => {
                let p: u8 = p.parse().map_err(|_| CidrError::Prefix(text.to_owned()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
            ("::/0", "::1", true),
            ("2001:db8::/32", "2001:db8:1::1", true),
            ("2001:db8::/32", "2001:db9::1", false),
            ("::ffff:10.0.0.0/104", "10.3.3.3", true),
            ("10.0.0.0/8", "::ffff:10.1.1.1", true),
        ];
        for (cidr, addr, expected) in cases {
            let parsed: Cidr = cidr.parse().unwrap();
            assert_eq!(parsed.contains(ip(addr)), expected, "{cidr} contains {addr}");
        }
        for bad in
            ["", "10.0.0.0/33", "::/129", "nonsense", "10.0.0.0/x", "10.0.0.0/", "10.0.0.0/+8", "::ffff:10.0.0.0/8"]
        {
            assert!(bad.parse::<Cidr>().is_err(), "{bad} should not parse");
        }
        assert!(" 10.0.0.0/8".parse::<Cidr>().is_err(), "blanks are the list's business");
        assert_eq!("10.1.2.3/8".parse::<Cidr>().unwrap().to_string(), "10.0.0.0/8");
    }
}

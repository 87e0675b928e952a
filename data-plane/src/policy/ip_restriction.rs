//! `ip_restriction`, the first check after CORS in the policy chain: allow and
//! deny CIDR lists (`sluice_proto::Cidr`, the one parser both planes use)
//! matched against the client's address, a few integer comparisons a request.

use std::net::IpAddr;

use http::StatusCode;
use sluice_proto::{Cidr, v1};

use super::rejection::Rejection;

#[derive(Debug)]
pub struct IpRestriction {
    allow: Vec<Cidr>,
    deny: Vec<Cidr>,
}

impl IpRestriction {
    pub fn compile(spec: &v1::IpRestriction) -> Result<Self, String> {
        let parse = |list: &[String]| {
            list.iter().map(|c| c.parse::<Cidr>().map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()
        };
        Ok(IpRestriction { allow: parse(&spec.allow)?, deny: parse(&spec.deny)? })
    }

    /// Deny wins over allow, so a broad allow list can carve out bad actors;
    /// a non-empty allow list admits only its blocks. `client_ip` is the peer
    /// address: X-Forwarded-For is client-controlled and not trusted here.
    pub fn check(&self, client_ip: IpAddr) -> Result<(), Rejection> {
        let denied = self.deny.iter().any(|b| b.contains(client_ip));
        let allowed = self.allow.is_empty() || self.allow.iter().any(|b| b.contains(client_ip));
        if denied || !allowed {
            return Err(Rejection::new("ip_restriction", StatusCode::FORBIDDEN, "ip-forbidden", "Forbidden")
                .detail("Requests from your address are not allowed on this API."));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> IpRestriction {
        IpRestriction::compile(&v1::IpRestriction {
            allow: allow.iter().map(ToString::to_string).collect(),
            deny: deny.iter().map(ToString::to_string).collect(),
        })
        .unwrap()
    }

    #[test]
    fn allow_deny_table() {
        let cases: &[(&[&str], &[&str], &str, bool)] = &[
            (&["10.0.0.0/8"], &[], "10.1.2.3", true),
            (&["10.0.0.0/8"], &[], "11.1.2.3", false),
            (&["10.0.0.0/8"], &["10.9.0.0/16"], "10.9.1.1", false),
            (&["10.0.0.0/8"], &["10.9.0.0/16"], "10.8.1.1", true),
            (&[], &["192.168.1.7"], "192.168.1.7", false),
            (&[], &["192.168.1.7"], "192.168.1.8", true),
            (&["0.0.0.0/0"], &[], "203.0.113.9", true),
            // IPv4 blocks do not match IPv6 clients and vice versa, but a
            // v4-mapped v6 address is the v4 client it stands for.
            (&["0.0.0.0/0"], &[], "2001:db8::1", false),
            (&["127.0.0.1"], &[], "::ffff:127.0.0.1", true),
            (&["2001:db8::/32"], &[], "2001:db8:5::1", true),
            (&["2001:db8::/32"], &[], "2001:db9::1", false),
            (&["::/0"], &["::1"], "::1", false),
            (&["::/0"], &[], "10.0.0.1", false),
        ];
        for (allow, deny, ip, want) in cases {
            let got = policy(allow, deny).check(ip.parse().unwrap()).is_ok();
            assert_eq!(got, *want, "allow {allow:?} deny {deny:?} ip {ip}");
        }
    }

    #[test]
    fn rejection_is_403() {
        let rejection = policy(&["10.0.0.0/8"], &[]).check("1.1.1.1".parse().unwrap()).unwrap_err();
        assert_eq!(rejection.status, StatusCode::FORBIDDEN);
    }

    #[test]
    fn bad_block_fails_compile() {
        let spec = v1::IpRestriction { allow: vec!["10.0.0.0/33".into()], deny: vec![] };
        assert!(IpRestriction::compile(&spec).unwrap_err().contains("10.0.0.0/33"));
    }
}

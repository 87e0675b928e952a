//! The cost bounds of a consumer's Argon2 password hash, one rule for both
//! planes: the control plane refuses a hash above them when it is written,
//! and a data plane refuses a snapshot carrying one. A data plane runs the
//! hash's own parameters for every login attempt, so an unbounded `m` lets
//! one unauthenticated request cost gigabytes.

/// Most memory one verification may use, in KiB (`m`): 64 MiB. The default
/// the control plane hashes with (OWASP's recommendation) is 19 MiB.
pub const MAX_ARGON2_MEMORY_KIB: u32 = 64 * 1024;
/// Most passes over that memory (`t`).
pub const MAX_ARGON2_ITERATIONS: u32 = 10;
/// Most lanes (`p`). The data plane computes lanes on one thread, so
/// parallelism only multiplies the work of one verification.
pub const MAX_ARGON2_PARALLELISM: u32 = 4;

/// Argon2's parameters as a PHC string states them (`m=19456,t=2,p=1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argon2Cost {
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
}

/// Checks an Argon2 PHC string (`$argon2id$v=19$m=...,t=...,p=...$salt$hash`)
/// names an Argon2 variant and stays within the bounds; the error says which
/// parameter is too high and what the bound is.
pub fn check_password_hash(phc: &str) -> Result<Argon2Cost, String> {
    let mut fields = phc.split('$');
    if fields.next() != Some("") {
        return Err("must be an Argon2 PHC string (`$argon2id$v=19$m=...,t=...,p=...$salt$hash`)".into());
    }
    match fields.next() {
        Some("argon2id" | "argon2i" | "argon2d") => {}
        _ => return Err("must be an Argon2 PHC string (`$argon2id$...`)".into()),
    }
    let params = fields
        .find(|field| field.contains("m="))
        .ok_or_else(|| "names no Argon2 parameters (`m=...,t=...,p=...`)".to_string())?;
    let (mut memory_kib, mut iterations, mut parallelism) = (None, None, None);
    for pair in params.split(',') {
        let (name, value) = pair.split_once('=').ok_or_else(|| format!("parameter `{pair}` has no value"))?;
        let value: u32 = value.parse().map_err(|_| format!("parameter `{name}` is not a number"))?;
        match name {
            "m" => memory_kib = Some(value),
            "t" => iterations = Some(value),
            "p" => parallelism = Some(value),
            _ => {}
        }
    }
    let (Some(memory_kib), Some(iterations), Some(parallelism)) = (memory_kib, iterations, parallelism) else {
        return Err("must state all of `m`, `t` and `p`".into());
    };
    if memory_kib > MAX_ARGON2_MEMORY_KIB {
        return Err(format!("uses m={memory_kib} KiB of memory; at most {MAX_ARGON2_MEMORY_KIB} (64 MiB) is allowed"));
    }
    if iterations > MAX_ARGON2_ITERATIONS {
        return Err(format!("uses t={iterations} iterations; at most {MAX_ARGON2_ITERATIONS} are allowed"));
    }
    if parallelism > MAX_ARGON2_PARALLELISM {
        return Err(format!("uses p={parallelism} lanes; at most {MAX_ARGON2_PARALLELISM} are allowed"));
    }
    Ok(Argon2Cost { memory_kib, iterations, parallelism })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_table() {
        let hash = |params: &str| format!("$argon2id$v=19${params}$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA");
        let cases = [
            (hash("m=19456,t=2,p=1"), Ok(Argon2Cost { memory_kib: 19456, iterations: 2, parallelism: 1 })),
            (hash("m=65536,t=10,p=4"), Ok(Argon2Cost { memory_kib: 65536, iterations: 10, parallelism: 4 })),
            (hash("m=4194304,t=1,p=1"), Err("m=4194304")),
            (hash("m=65537,t=1,p=1"), Err("m=65537")),
            (hash("m=1024,t=11,p=1"), Err("t=11")),
            (hash("m=1024,t=1,p=5"), Err("p=5")),
            (hash("m=1024,t=1"), Err("all of")),
            (hash("m=lots,t=1,p=1"), Err("not a number")),
            ("$scrypt$ln=16,r=8,p=1$salt$hash".to_string(), Err("Argon2")),
            ("plaintext".to_string(), Err("Argon2")),
        ];
        for (phc, want) in cases {
            match (check_password_hash(&phc), want) {
                (Ok(cost), Ok(expected)) => assert_eq!(cost, expected, "{phc}"),
                (Err(message), Err(needle)) => assert!(message.contains(needle), "{phc}: {message}"),
                (got, want) => panic!("{phc}: got {got:?}, want {want:?}"),
            }
        }
    }
}

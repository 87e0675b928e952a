//! The machine's shared services in tests (PostgreSQL, Redis), by one rule:
//! a test that needs one reads its URL from an environment variable; unset,
//! the test is skipped with a note, except under `CI=true`, where it fails.
//! CI must never pass by skipping what it is there to prove. A URL that is
//! set names a service the developer wants tested: unreachable, it fails.

use anyhow::{Result, bail};

/// Under CI (`CI=true`, or `CI=1` as some runners set it).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The URL in `var`, or `Ok(None)` (after a note on stderr) when it is unset
/// outside CI; unset under CI is an error. `example` shows a valid value.
pub fn service_url(var: &str, example: &str) -> Result<Option<String>> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Ok(Some(url)),
        _ if in_ci() => bail!("{var} is not set, and CI=true: the tests that need it must run in CI"),
        _ => {
            eprintln!("skipping: set {var} (e.g. {example}) to run this test");
            Ok(None)
        }
    }
}

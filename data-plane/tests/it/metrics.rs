//! `/metrics` across snapshot swaps, with a real `sluice-dp` and
//! `sluice-test-upstream`s: what a swap removes leaves `/metrics`, what it
//! keeps keeps counting.

use anyhow::Result;
use sluice_proto::v1;
use sluice_proto::v1::policy::Kind;

use crate::fake_cp::{FakeControlPlane, seal};
use crate::policies::{HMAC_KEY, hmac_hex};
use crate::support::{DataPlane, Upstream, api, client, send};

/// The sum of the series whose line starts with `prefix` (a name and the
/// first labels), 0 when there is none.
fn series_sum(text: &str, prefix: &str) -> f64 {
    let values = text.lines().filter(|line| line.starts_with(prefix)).filter_map(|line| line.rsplit_once(' '));
    values.filter_map(|(_, value)| value.parse::<f64>().ok()).sum()
}

async fn scrape(dp: &DataPlane) -> Result<String> {
    Ok(client().get(dp.ops_url("/metrics")).send().await?.text().await?)
}

#[tokio::test]
async fn a_swap_drops_the_series_of_what_it_removed_and_keeps_counting_the_rest() -> Result<()> {
    let (a, b, c) = (Upstream::start("a").await?, Upstream::start("b").await?, Upstream::start("c").await?);
    let (b_url, c_url) = (b.url(), c.url());
    let consumer = |name: &str, key: &str| -> Result<v1::Consumer> {
        Ok(v1::Consumer { username: name.into(), api_key_digests: vec![hmac_hex(key)?], ..Default::default() })
    };
    let api_key = Kind::ApiKey(v1::ApiKeyAuth { header: "x-api-key".into(), query_param: String::new() });
    let upstream = |name: &str, targets: &[&Upstream]| v1::Upstream {
        name: name.into(),
        targets: targets.iter().map(|t| v1::Target { url: t.url(), weight: 1 }).collect(),
        ..Default::default()
    };
    let first = v1::Snapshot {
        version: 1,
        apis: vec![
            api("kept", "/kept", "pool", vec![api_key.clone()]),
            api("dropped", "/dropped", "leaving", vec![api_key]),
        ],
        upstreams: vec![upstream("pool", &[&a, &b]), upstream("leaving", &[&c])],
        consumers: vec![consumer("ann", "ann-key")?, consumer("leaver", "leaver-key")?],
        api_key_hmac_key: HMAC_KEY.to_vec(),
        ..Default::default()
    };
    // The same without API `dropped`, upstream `leaving`, target b of `pool` and consumer `leaver`.
    let second = v1::Snapshot {
        version: 2,
        apis: vec![first.apis[0].clone()],
        upstreams: vec![upstream("pool", &[&a])],
        consumers: vec![first.consumers[0].clone()],
        ..first.clone()
    };

    let mut cp = FakeControlPlane::start().await?;
    let dp = DataPlane::start(&cp.url(), &["--access-log", "off"]).await?;
    let mut conn = cp.accept().await?;
    conn.push(seal(first.clone())).await?;
    conn.ack().await?;
    let http = client();
    for (path, key) in [("/kept/1", "ann-key"), ("/kept/2", "ann-key"), ("/dropped/1", "leaver-key")] {
        let (status, _, _) = send(http.get(dp.url(path)).header("x-api-key", key)).await?;
        assert_eq!(status, 200, "{path}");
    }
    // A refusal, so that `dropped` has a policy series too.
    let (status, _, _) = send(http.get(dp.url("/dropped/2"))).await?;
    assert_eq!(status, 401);

    let text = scrape(&dp).await?;
    let leaving = [
        "api=\"dropped\"".to_string(),
        "upstream=\"leaving\"".into(),
        format!("target=\"{b_url}\""),
        "consumer=\"leaver\"".into(),
    ];
    for label in &leaving {
        assert!(text.contains(label.as_str()), "no {label} before the swap:\n{text}");
    }
    assert!(text.contains(&format!("sluice_upstream_healthy{{upstream=\"leaving\",target=\"{c_url}\"}} 1")), "{text}");
    assert!(text.contains("sluice_policy_rejections_total{api=\"dropped\""), "{text}");
    assert_eq!(series_sum(&text, "sluice_requests_total{api=\"kept\""), 2.0, "{text}");

    conn.push(seal(second)).await?;
    conn.ack().await?;
    let text = scrape(&dp).await?;
    for label in &leaving {
        let stale: Vec<&str> = text.lines().filter(|line| line.contains(label.as_str())).collect();
        assert!(stale.is_empty(), "{label} is still shown after the swap: {stale:#?}");
    }
    // What stayed is still there, with its counts.
    assert!(text.contains(&format!("sluice_upstream_healthy{{upstream=\"pool\",target=\"{}\"}} 1", a.url())), "{text}");
    assert_eq!(series_sum(&text, "sluice_requests_total{api=\"kept\""), 2.0, "{text}");
    assert_eq!(series_sum(&text, "sluice_consumer_requests_total{consumer=\"ann\"}"), 2.0, "{text}");
    assert_eq!(series_sum(&text, "sluice_upstream_request_duration_seconds_count{upstream=\"pool\"}"), 2.0);

    // ... and keeps counting.
    for i in 0..3 {
        let (status, _, _) = send(http.get(dp.url(&format!("/kept/after{i}"))).header("x-api-key", "ann-key")).await?;
        assert_eq!(status, 200);
    }
    let text = scrape(&dp).await?;
    assert_eq!(series_sum(&text, "sluice_requests_total{api=\"kept\""), 5.0, "{text}");
    assert_eq!(series_sum(&text, "sluice_request_duration_seconds_count{api=\"kept\"}"), 5.0, "{text}");
    assert_eq!(series_sum(&text, "sluice_consumer_requests_total{consumer=\"ann\"}"), 5.0, "{text}");
    assert_eq!(series_sum(&text, "sluice_upstream_request_duration_seconds_count{upstream=\"pool\"}"), 5.0);
    for label in &leaving {
        assert!(!text.contains(label.as_str()), "{label} came back:\n{text}");
    }
    crate::observe::assert_every_series_has_help(&text);

    // A name that comes back starts from zero.
    let third = v1::Snapshot { version: 3, ..first };
    conn.push(seal(third)).await?;
    conn.ack().await?;
    let (status, _, _) = send(http.get(dp.url("/dropped/again")).header("x-api-key", "ann-key")).await?;
    assert_eq!(status, 200);
    let text = scrape(&dp).await?;
    assert_eq!(series_sum(&text, "sluice_requests_total{api=\"dropped\""), 1.0, "{text}");
    Ok(())
}

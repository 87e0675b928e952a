//! The heartbeat's summary of what this node sees: each API's traffic since
//! the previous heartbeat and each upstream target's health, both cut to the
//! contract's caps (`sluice_proto::telemetry`) so a heartbeat stays small
//! whatever the configuration. Built on the sync task, off the request path:
//! requests only add to counters (`base::TrafficCounters`).

use std::time::Duration;

use sluice_proto::telemetry::{MAX_HEARTBEAT_APIS, MAX_HEARTBEAT_TARGETS};
use sluice_proto::v1::{ApiTraffic, TargetHealth, TargetState, TrafficSummary};

use crate::routing::RoutingTable;

/// The traffic since the previous call (which took the counters), and the
/// targets with how many were left out.
pub(super) fn summarise(table: Option<&RoutingTable>, interval: Duration) -> (TrafficSummary, Vec<TargetHealth>, u32) {
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    let Some(table) = table else { return (TrafficSummary { interval_ms, ..Default::default() }, Vec::new(), 0) };

    // Every API's counters are taken, sent or not, so a left-out API's
    // requests do not pile up into a later interval.
    let mut apis: Vec<ApiTraffic> = table
        .apis()
        .iter()
        .filter_map(|api| {
            let counts = api.metrics.take_traffic()?;
            Some(ApiTraffic {
                api: api.name.clone(),
                requests: counts.requests,
                errors: counts.errors,
                latency_buckets: counts.latency.to_vec(),
            })
        })
        .collect();
    apis.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.api.cmp(&b.api)));
    let apis_omitted = apis.len().saturating_sub(MAX_HEARTBEAT_APIS);
    apis.truncate(MAX_HEARTBEAT_APIS);

    let mut targets: Vec<TargetHealth> =
        table.upstreams().flat_map(|pool| pool.targets().iter().map(|target| target.health())).collect();
    targets.sort_by(|a, b| {
        let healthy = |t: &TargetHealth| t.state() == TargetState::Healthy;
        healthy(a).cmp(&healthy(b)).then_with(|| (&a.upstream, &a.url).cmp(&(&b.upstream, &b.url)))
    });
    let targets_omitted = targets.len().saturating_sub(MAX_HEARTBEAT_TARGETS);
    targets.truncate(MAX_HEARTBEAT_TARGETS);

    let traffic = TrafficSummary { interval_ms, apis, apis_omitted: saturate(apis_omitted) };
    (traffic, targets, saturate(targets_omitted))
}

fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use http::{Method, StatusCode};
    use sluice_proto::v1;

    use super::*;
    use crate::policy::PolicyContext;
    use crate::routing::compile;

    fn table(apis: usize, targets: usize) -> RoutingTable {
        let upstream = v1::Upstream {
            name: "pool".into(),
            targets: (0..targets)
                .map(|i| v1::Target { url: format!("http://127.0.0.1:{}", 1000 + i), weight: 1 })
                .collect(),
            passive_health_check: Some(v1::PassiveHealthCheck {
                consecutive_failures: 1,
                ejection_ms: 60_000,
                ..Default::default()
            }),
            ..Default::default()
        };
        let apis = (0..apis)
            .map(|i| v1::Api {
                name: format!("api-{i:03}"),
                path_prefix: format!("/api-{i:03}"),
                upstream: "pool".into(),
                ..Default::default()
            })
            .collect();
        let snapshot = v1::Snapshot { version: 1, apis, upstreams: vec![upstream], ..Default::default() };
        compile(&snapshot, None, &PolicyContext::local()).unwrap()
    }

    #[test]
    fn the_busiest_apis_and_the_unhealthy_targets_come_first_within_the_caps() {
        let table = table(MAX_HEARTBEAT_APIS + 5, MAX_HEARTBEAT_TARGETS + 1);
        // API i serves i requests, the tenth of them 5xx; api-000 serves none.
        for (i, api) in table.apis().iter().enumerate() {
            for n in 0..i {
                let status = if n % 10 == 0 { StatusCode::BAD_GATEWAY } else { StatusCode::OK };
                api.metrics.record(&Method::GET, status, Duration::from_millis(3), (0, 0), None);
            }
        }
        let pool = table.upstream("pool").unwrap();
        let last = pool.targets().last().unwrap().clone();
        pool.record_failure(&last);

        let (traffic, targets, omitted) = summarise(Some(&table), Duration::from_secs(5));
        assert_eq!(traffic.interval_ms, 5_000);
        assert_eq!(traffic.apis.len(), MAX_HEARTBEAT_APIS);
        // 104 APIs had traffic; the four quietest are left out.
        assert_eq!(traffic.apis_omitted, 4);
        let busiest = &traffic.apis[0];
        assert_eq!((busiest.api.as_str(), busiest.requests, busiest.errors), ("api-104", 104, 11));
        assert_eq!(busiest.latency_buckets.len(), sluice_proto::telemetry::LATENCY_BUCKETS);
        assert_eq!(busiest.latency_buckets[2], 104, "3 ms is in the (2.5, 5] ms bucket");
        assert_eq!(targets.len(), MAX_HEARTBEAT_TARGETS);
        assert_eq!(omitted, 1);
        assert_eq!((targets[0].url.as_str(), targets[0].state()), (last.url.as_str(), TargetState::Ejected));

        // The counters were taken: the next interval is empty.
        let (traffic, _, _) = summarise(Some(&table), Duration::from_secs(5));
        assert!(traffic.apis.is_empty() && traffic.apis_omitted == 0);
        let (traffic, targets, _) = summarise(None, Duration::from_secs(1));
        assert!(traffic.apis.is_empty() && targets.is_empty());
    }
}

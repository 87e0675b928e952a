//! What data planes report in their heartbeats beside their version: each
//! upstream target's health as the node sees it, and each API's traffic over
//! the last interval. Fed by the sync sessions, read by the admin API
//! (`/v1/upstream-health`, `/v1/traffic`, `/v1/data-planes/{node_id}/telemetry`).
//!
//! Memory only, per control-plane process: a node's reports are on the
//! control plane it is connected to, and a restart starts the charts afresh.
//! Bounded whatever the nodes send: per node the latest health report (at
//! most `MAX_HEARTBEAT_TARGETS` targets) and [`SLOTS`] time slots of
//! [`SLOT_MS`] (15 minutes), each with at most `MAX_HEARTBEAT_APIS` APIs; a
//! node silent for the whole window is forgotten.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::Serialize;
use sluice_proto::telemetry::{LATENCY_BUCKETS, MAX_HEARTBEAT_APIS, MAX_HEARTBEAT_TARGETS, latency_quantile_ms};
use sluice_proto::text::truncate;
use sluice_proto::v1;
use utoipa::ToSchema;

/// Width of a time slot: a heartbeat's counts go to the slot in which it
/// arrived. Wider than the default heartbeat interval (5 s), so a slot
/// usually holds two heartbeats of each node.
pub const SLOT_MS: i64 = 10_000;
/// Slots kept per node: 15 minutes.
pub const SLOTS: usize = 90;
/// The time the slots span.
pub const WINDOW_MS: i64 = SLOT_MS * SLOTS as i64;

/// A target URL longer than this is cut (it is shown, and matched against the configuration's, which
/// `proto::validate` bounds far below).
const MAX_URL_LEN: usize = 2_048;
/// An interval longer than the window (a node that was away from every control plane for an hour) is
/// counted as the window: its requests spread over the time they took, not more.
const MAX_INTERVAL_MS: u64 = WINDOW_MS as u64;

/// Every node's reports. Cheap to clone; clones share the reports.
#[derive(Clone, Default)]
pub struct Telemetry {
    /// Each node behind its own lock, so a heartbeat waits only for readers of its own node and the map's
    /// lock is held for a lookup only.
    nodes: Arc<Mutex<HashMap<String, Arc<Mutex<NodeTelemetry>>>>>,
}

#[derive(Default)]
struct NodeTelemetry {
    health: Option<HealthReport>,
    /// Oldest first; contiguous in time only where the node reported.
    slots: VecDeque<Slot>,
    last_report: i64,
}

/// A target's health as one data plane sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TargetState {
    /// The balancer may pick it.
    Healthy,
    /// Taken out by the passive check (consecutive failures) until its ejection time is over.
    Ejected,
    /// Failing its active health check.
    FailingActiveCheck,
}

/// One data plane's latest view of its targets.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HealthReport {
    /// Unix milliseconds, when the heartbeat arrived.
    pub reported_at: i64,
    /// Each target of the configuration the node runs, the unhealthy first.
    pub targets: Vec<ReportedTarget>,
    /// Targets the node left out (it sends at most 500).
    pub targets_omitted: u32,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReportedTarget {
    pub upstream: String,
    /// The target's URL as configured, without a trailing slash.
    pub url: String,
    pub state: TargetState,
}

struct Slot {
    start: i64,
    /// The time the heartbeats in this slot cover: the denominator of its rates.
    covered_ms: u64,
    apis: Vec<ApiCounts>,
    apis_omitted: u32,
}

#[derive(Clone)]
struct ApiCounts {
    api: String,
    requests: u64,
    errors: u64,
    latency: [u64; LATENCY_BUCKETS],
}

impl Telemetry {
    /// Takes in one heartbeat of `node_id`, arrived at `now` (Unix ms).
    pub fn record(&self, node_id: &str, now: i64, heartbeat: &v1::Heartbeat) {
        let node = {
            let mut nodes = lock(&self.nodes);
            nodes.entry(node_id.to_owned()).or_default().clone()
        };
        let mut node = lock(&node);
        node.last_report = now;
        node.health = Some(health_report(now, heartbeat));
        if let Some(traffic) = &heartbeat.traffic {
            node.add_traffic(now, traffic);
        }
    }

    /// Forgets nodes that reported nothing since `cutoff` (Unix ms).
    pub fn forget_silent_since(&self, cutoff: i64) {
        let nodes: Vec<(String, Arc<Mutex<NodeTelemetry>>)> =
            lock(&self.nodes).iter().map(|(id, node)| (id.clone(), node.clone())).collect();
        let silent: Vec<String> =
            nodes.into_iter().filter(|(_, node)| lock(node).last_report < cutoff).map(|(id, _)| id).collect();
        if !silent.is_empty() {
            let mut map = lock(&self.nodes);
            for id in silent {
                // A heartbeat may have come in between: only a node still silent goes.
                if map.get(&id).is_some_and(|node| lock(node).last_report < cutoff) {
                    map.remove(&id);
                }
            }
        }
    }

    /// Every node's latest health report, by node id.
    pub fn health(&self) -> BTreeMap<String, HealthReport> {
        self.nodes().into_iter().filter_map(|(id, node)| lock(&node).health.clone().map(|h| (id, h))).collect()
    }

    /// One node's health report and traffic; `None` when it sent nothing (to this control plane) in the window.
    pub fn node(&self, node_id: &str, now: i64) -> Option<NodeView> {
        let node = lock(&self.nodes).get(node_id)?.clone();
        let node = lock(&node);
        let mut series = Series::default();
        series.add_node(node_id, &node, now);
        Some(NodeView { node_id: node_id.to_owned(), health: node.health.clone(), traffic: series.view() })
    }

    /// Every node's traffic added up, per API.
    pub fn traffic(&self, now: i64) -> TrafficView {
        let mut series = Series::default();
        for (id, node) in self.nodes() {
            series.add_node(&id, &lock(&node), now);
        }
        series.view()
    }

    fn nodes(&self) -> Vec<(String, Arc<Mutex<NodeTelemetry>>)> {
        let mut nodes: Vec<_> = lock(&self.nodes).iter().map(|(id, node)| (id.clone(), node.clone())).collect();
        nodes.sort_by(|a, b| a.0.cmp(&b.0));
        nodes
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent (whole inserts and removals), so a panic in one does
    // not make the reports unreadable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The heartbeat's targets as kept: within the cap, names bounded, states of a newer build (unknown here) left
/// out rather than guessed.
fn health_report(now: i64, heartbeat: &v1::Heartbeat) -> HealthReport {
    let mut omitted = heartbeat.targets_omitted;
    let mut targets = Vec::with_capacity(heartbeat.targets.len().min(MAX_HEARTBEAT_TARGETS));
    for target in &heartbeat.targets {
        let state = match v1::TargetState::try_from(target.state) {
            Ok(v1::TargetState::Healthy) => TargetState::Healthy,
            Ok(v1::TargetState::Ejected) => TargetState::Ejected,
            Ok(v1::TargetState::FailingActiveCheck) => TargetState::FailingActiveCheck,
            Err(_) => continue,
        };
        if targets.len() == MAX_HEARTBEAT_TARGETS {
            omitted = omitted.saturating_add(1);
            continue;
        }
        targets.push(ReportedTarget {
            upstream: truncate(target.upstream.clone(), sluice_proto::MAX_NAME_LEN),
            url: truncate(target.url.clone(), MAX_URL_LEN),
            state,
        });
    }
    HealthReport { reported_at: now, targets, targets_omitted: omitted }
}

impl NodeTelemetry {
    fn add_traffic(&mut self, now: i64, traffic: &v1::TrafficSummary) {
        // A summary that covers no time has no rate; a data plane always measures its interval.
        if traffic.interval_ms == 0 {
            return;
        }
        let start = now - now.rem_euclid(SLOT_MS);
        if self.slots.back().is_none_or(|slot| slot.start < start) {
            if self.slots.len() == SLOTS {
                self.slots.pop_front();
            }
            self.slots.push_back(Slot { start, covered_ms: 0, apis: Vec::new(), apis_omitted: 0 });
        }
        // The clock went back (an NTP step): add to the newest slot rather than reorder the ring.
        let Some(slot) = self.slots.back_mut() else { return };
        slot.covered_ms = slot.covered_ms.saturating_add(traffic.interval_ms.min(MAX_INTERVAL_MS));
        slot.apis_omitted = slot.apis_omitted.saturating_add(traffic.apis_omitted);
        for reported in traffic.apis.iter().take(MAX_HEARTBEAT_APIS) {
            let name = truncate(reported.api.clone(), sluice_proto::MAX_NAME_LEN);
            let counts = match slot.apis.iter_mut().position(|a| a.api == name) {
                Some(i) => &mut slot.apis[i],
                None if slot.apis.len() < MAX_HEARTBEAT_APIS => {
                    slot.apis.push(ApiCounts { api: name, requests: 0, errors: 0, latency: [0; LATENCY_BUCKETS] });
                    let last = slot.apis.len() - 1;
                    &mut slot.apis[last]
                }
                None => {
                    slot.apis_omitted = slot.apis_omitted.saturating_add(1);
                    continue;
                }
            };
            counts.requests = counts.requests.saturating_add(reported.requests);
            counts.errors = counts.errors.saturating_add(reported.errors.min(reported.requests));
            // A histogram of another length (another build) is read as far as both go.
            for (sum, count) in counts.latency.iter_mut().zip(&reported.latency_buckets) {
                *sum = sum.saturating_add(*count);
            }
        }
        self.slots.retain(|slot| slot.start > now - WINDOW_MS);
    }
}

/// The traffic of one or more nodes, per slot and API.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TrafficView {
    /// Width of each point's slot, in seconds.
    pub slot_seconds: u64,
    /// How far back the points go, in seconds.
    pub window_seconds: u64,
    /// The data planes whose reports are added up here, by node id.
    pub data_planes: Vec<String>,
    /// Start of every slot some data plane reported in (Unix milliseconds), oldest first: each API has a
    /// point for each.
    pub slots: Vec<i64>,
    /// Each API with requests in the window, by name.
    pub apis: Vec<ApiSeries>,
    /// API entries the data planes left out of their heartbeats (they send at most 100, the busiest).
    pub apis_omitted: u64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApiSeries {
    pub api: String,
    /// Requests in the whole window.
    pub requests: u64,
    /// Of which answered with a 5xx.
    pub errors: u64,
    /// One point per slot of `slots`, in the same order.
    pub points: Vec<TrafficPoint>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TrafficPoint {
    /// Start of the slot, Unix milliseconds.
    pub at: i64,
    pub requests: u64,
    pub errors: u64,
    /// Each data plane's requests over the time its heartbeats in this slot cover, added up.
    pub requests_per_second: f64,
    /// `errors / requests`, 0 without requests.
    pub error_rate: f64,
    /// 99th percentile of the request duration (to the end of the response) in milliseconds, from the data
    /// planes' latency histograms added up; null without requests.
    pub p99_ms: Option<f64>,
}

/// One data plane's reports.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeView {
    pub node_id: String,
    /// Its latest heartbeat's targets; null if it sent none.
    pub health: Option<HealthReport>,
    pub traffic: TrafficView,
}

/// The sum being built: per API, per slot start.
#[derive(Default)]
struct Series {
    data_planes: Vec<String>,
    slots: BTreeSet<i64>,
    apis: BTreeMap<String, BTreeMap<i64, Point>>,
    apis_omitted: u64,
}

#[derive(Default)]
struct Point {
    requests: u64,
    errors: u64,
    rate: f64,
    latency: [u64; LATENCY_BUCKETS],
}

impl Series {
    fn add_node(&mut self, node_id: &str, node: &NodeTelemetry, now: i64) {
        let mut reported = false;
        for slot in node.slots.iter().filter(|slot| slot.start > now - WINDOW_MS) {
            reported = true;
            self.slots.insert(slot.start);
            self.apis_omitted += u64::from(slot.apis_omitted);
            let seconds = slot.covered_ms.max(1) as f64 / 1_000.0;
            for counts in &slot.apis {
                let point = self.apis.entry(counts.api.clone()).or_default().entry(slot.start).or_default();
                point.requests += counts.requests;
                point.errors += counts.errors;
                point.rate += counts.requests as f64 / seconds;
                for (sum, count) in point.latency.iter_mut().zip(counts.latency) {
                    *sum += count;
                }
            }
        }
        if reported {
            self.data_planes.push(node_id.to_owned());
        }
    }

    fn view(self) -> TrafficView {
        let slots: Vec<i64> = self.slots.into_iter().collect();
        let apis = self
            .apis
            .into_iter()
            .map(|(api, points)| {
                let points: Vec<TrafficPoint> = slots
                    .iter()
                    .map(|at| {
                        let p = points.get(at);
                        let (requests, errors) = p.map_or((0, 0), |p| (p.requests, p.errors));
                        TrafficPoint {
                            at: *at,
                            requests,
                            errors,
                            requests_per_second: p.map_or(0.0, |p| round3(p.rate)),
                            error_rate: if requests == 0 { 0.0 } else { round3(errors as f64 / requests as f64) },
                            p99_ms: p.and_then(|p| latency_quantile_ms(&p.latency, 0.99)).map(round3),
                        }
                    })
                    .collect();
                ApiSeries {
                    api,
                    requests: points.iter().map(|p| p.requests).sum(),
                    errors: points.iter().map(|p| p.errors).sum(),
                    points,
                }
            })
            .collect();
        TrafficView {
            slot_seconds: (SLOT_MS / 1_000) as u64,
            window_seconds: (WINDOW_MS / 1_000) as u64,
            data_planes: self.data_planes,
            slots,
            apis,
            apis_omitted: self.apis_omitted,
        }
    }
}

/// Three decimals are more than a chart or an operator can use, and keep the JSON short.
fn round3(value: f64) -> f64 {
    (value * 1_000.0).round() / 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(interval_ms: u64, apis: &[(&str, u64, u64, usize)], targets: &[(&str, v1::TargetState)]) -> v1::Heartbeat {
        let apis = apis
            .iter()
            .map(|(api, requests, errors, bucket)| {
                let mut latency_buckets = vec![0; LATENCY_BUCKETS];
                latency_buckets[*bucket] = *requests;
                v1::ApiTraffic { api: (*api).into(), requests: *requests, errors: *errors, latency_buckets }
            })
            .collect();
        let targets = targets
            .iter()
            .map(|(url, state)| v1::TargetHealth {
                upstream: "pool".into(),
                url: (*url).into(),
                state: (*state).into(),
            })
            .collect();
        v1::Heartbeat {
            traffic: Some(v1::TrafficSummary { interval_ms, apis, apis_omitted: 0 }),
            targets,
            ..Default::default()
        }
    }

    const T0: i64 = 1_700_000_000_000;

    #[test]
    fn nodes_add_up_per_slot_and_rates_use_the_time_each_covers() {
        let telemetry = Telemetry::default();
        // Node a: two heartbeats of 5 s in one slot, 100 requests each (20/s), 10 errors in all.
        telemetry.record("a", T0 + 1_000, &beat(5_000, &[("shop", 100, 10, 1)], &[]));
        telemetry.record("a", T0 + 6_000, &beat(5_000, &[("shop", 100, 0, 1)], &[]));
        // Node b: one heartbeat of 1 s with 10 slow requests (10/s).
        telemetry.record("b", T0 + 2_000, &beat(1_000, &[("shop", 10, 0, 9)], &[]));
        // Next slot: only node a, another API.
        telemetry.record("a", T0 + 11_000, &beat(5_000, &[("admin", 5, 5, 0)], &[]));

        let view = telemetry.traffic(T0 + 12_000);
        assert_eq!(view.data_planes, ["a", "b"]);
        assert_eq!(view.slots, [T0, T0 + SLOT_MS]);
        let shop = view.apis.iter().find(|a| a.api == "shop").expect("shop");
        assert_eq!((shop.requests, shop.errors), (210, 10));
        let first = &shop.points[0];
        assert_eq!(first.requests_per_second, 30.0);
        assert_eq!(first.error_rate, 0.048);
        // 200 fast requests (1-2.5 ms) and 10 slow ones (0.5-1 s): the 99th percentile is among the slow.
        assert!(first.p99_ms.is_some_and(|p| p > 500.0 && p <= 1_000.0), "{:?}", first.p99_ms);
        // A slot where the API had no requests is a zero point, not a gap.
        assert_eq!((shop.points[1].requests, shop.points[1].p99_ms), (0, None));
        let admin = view.apis.iter().find(|a| a.api == "admin").expect("admin");
        assert_eq!((admin.points[1].error_rate, admin.points[1].requests_per_second), (1.0, 1.0));

        // One node alone.
        let b = telemetry.node("b", T0 + 12_000).expect("b reported");
        assert_eq!(b.traffic.slots, [T0]);
        assert!(telemetry.node("c", T0).is_none());
    }

    #[test]
    fn slots_and_reports_are_bounded() {
        let telemetry = Telemetry::default();
        let many: Vec<(String, u64, u64, usize)> =
            (0..MAX_HEARTBEAT_APIS + 50).map(|i| (format!("api-{i}"), 1, 0, 0)).collect();
        let many: Vec<(&str, u64, u64, usize)> = many.iter().map(|(n, r, e, b)| (n.as_str(), *r, *e, *b)).collect();
        let targets: Vec<(String, v1::TargetState)> =
            (0..MAX_HEARTBEAT_TARGETS + 3).map(|i| (format!("http://h:{i}"), v1::TargetState::Healthy)).collect();
        let targets: Vec<(&str, v1::TargetState)> = targets.iter().map(|(u, s)| (u.as_str(), *s)).collect();
        // An hour of heartbeats, one per 5 s.
        for n in 0..720 {
            telemetry.record("a", T0 + n * 5_000, &beat(5_000, &many, &targets));
        }
        let now = T0 + 719 * 5_000;
        let node = telemetry.node("a", now).expect("a");
        assert_eq!(node.traffic.slots.len(), SLOTS);
        assert_eq!(node.traffic.apis.len(), MAX_HEARTBEAT_APIS);
        let health = node.health.expect("health");
        assert_eq!((health.targets.len(), health.targets_omitted), (MAX_HEARTBEAT_TARGETS, 3));

        // An unknown state (a newer build's) is left out; a silent node is forgotten after the window.
        let mut odd = beat(5_000, &[], &[("http://h:1", v1::TargetState::Ejected)]);
        odd.targets.push(v1::TargetHealth { upstream: "pool".into(), url: "http://h:2".into(), state: 99 });
        telemetry.record("b", now, &odd);
        let b = telemetry.health().remove("b").expect("b");
        assert_eq!(b.targets.len(), 1);
        assert_eq!(b.targets[0].state, TargetState::Ejected);
        telemetry.forget_silent_since(now);
        assert!(telemetry.node("a", now).is_some() && telemetry.node("b", now).is_some());
        telemetry.forget_silent_since(now + 1);
        assert!(telemetry.health().is_empty());
    }
}

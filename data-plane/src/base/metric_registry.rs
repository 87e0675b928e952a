//! The process's metrics recorder, between every `metrics::counter!`,
//! `gauge!` and `histogram!` of the data plane and the ops listener's
//! `/metrics` (Prometheus text). Ours rather than metrics-exporter-prometheus
//! so that a snapshot swap can drop the series of the APIs, upstreams,
//! targets and consumers that left the configuration (`routing` decides
//! which): that exporter keeps every series it ever saw for the life of the
//! process, so a deleted upstream's `sluice_upstream_healthy` stayed forever.
//!
//! Handles are plain atomics shared with the registry: the request path
//! increments them without a lock. A dropped series' handle may still be
//! held (by a request on the table it came from); its increments then reach
//! no scrape, which is what a removed API's last requests deserve.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use metrics::{Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{Registry, Storage};

/// Every histogram's buckets, in seconds (every histogram here is a
/// duration): from sub-millisecond proxy overhead to slow upstreams.
pub const SECONDS_BUCKETS: [f64; 15] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A histogram as Prometheus renders it: a count per bucket (the last one
/// past every bound) and the sum. Recording is a bucket search over 15
/// bounds and two atomic additions; nothing is buffered until a scrape.
#[derive(Debug)]
pub struct Buckets {
    counts: [AtomicU64; SECONDS_BUCKETS.len() + 1],
    /// An `f64`'s bits.
    sum: AtomicU64,
}

impl Buckets {
    fn new() -> Self {
        Buckets { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum: AtomicU64::new(0) }
    }
}

impl HistogramFn for Buckets {
    fn record(&self, value: f64) {
        // The first bound at or above the value (`le` is inclusive); NaN lands in the first.
        let bucket = SECONDS_BUCKETS.partition_point(|bound| *bound < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let add = |bits: u64| Some((f64::from_bits(bits) + value).to_bits());
        let _ = self.sum.fetch_update(Ordering::Relaxed, Ordering::Relaxed, add);
    }
}

#[derive(Debug)]
struct AtomicStore;

impl Storage<Key> for AtomicStore {
    type Counter = Arc<AtomicU64>;
    /// An `f64`'s bits.
    type Gauge = Arc<AtomicU64>;
    type Histogram = Arc<Buckets>;

    fn counter(&self, _: &Key) -> Self::Counter {
        Arc::new(AtomicU64::new(0))
    }

    fn gauge(&self, _: &Key) -> Self::Gauge {
        Arc::new(AtomicU64::new(0))
    }

    fn histogram(&self, _: &Key) -> Self::Histogram {
        Arc::new(Buckets::new())
    }
}

/// The series of every metric, with the `# HELP` texts.
pub struct MetricRegistry {
    registry: Registry<Key, AtomicStore>,
    descriptions: Mutex<HashMap<String, SharedString>>,
}

impl std::fmt::Debug for MetricRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricRegistry").finish_non_exhaustive()
    }
}

static INSTALLED: OnceLock<Arc<MetricRegistry>> = OnceLock::new();

impl MetricRegistry {
    pub fn new() -> Self {
        MetricRegistry { registry: Registry::new(AtomicStore), descriptions: Mutex::new(HashMap::new()) }
    }

    /// The process-wide registry, installed as the global recorder by the
    /// first caller. Tests build several apps in one process and the global
    /// recorder can be set once, so everyone shares it. When another recorder
    /// got there first, this one sees no series and `/metrics` is empty.
    pub fn install() -> Arc<MetricRegistry> {
        INSTALLED
            .get_or_init(|| {
                let registry = Arc::new(MetricRegistry::new());
                if let Err(e) = metrics::set_global_recorder(registry.clone()) {
                    tracing::warn!(error = %e, "a metrics recorder is already installed; /metrics will be empty");
                }
                registry
            })
            .clone()
    }

    /// Drops every series `gone` picks, from the installed registry (none installed: nothing to drop).
    pub fn forget_installed(gone: impl Fn(&Key) -> bool) {
        if let Some(registry) = INSTALLED.get() {
            registry.forget(gone);
        }
    }

    /// Drops every series `gone` picks. A handle still held keeps working
    /// but is no longer rendered; registering the same key again starts a
    /// new series at zero.
    pub fn forget(&self, gone: impl Fn(&Key) -> bool) {
        self.registry.retain_counters(|key, _| !gone(key));
        self.registry.retain_gauges(|key, _| !gone(key));
        self.registry.retain_histograms(|key, _| !gone(key));
    }

    /// Prometheus text exposition (version 0.0.4), metrics by name, series by labels.
    pub fn render(&self) -> String {
        let mut counters: Vec<(Key, Arc<AtomicU64>)> = Vec::new();
        let mut gauges: Vec<(Key, Arc<AtomicU64>)> = Vec::new();
        let mut histograms: Vec<(Key, Arc<Buckets>)> = Vec::new();
        self.registry.visit_counters(|key, handle| counters.push((key.clone(), handle.clone())));
        self.registry.visit_gauges(|key, handle| gauges.push((key.clone(), handle.clone())));
        self.registry.visit_histograms(|key, handle| histograms.push((key.clone(), handle.clone())));
        let samples = (counters.iter().map(|(key, c)| (key, Sample::Counter(c.load(Ordering::Relaxed)))))
            .chain(gauges.iter().map(|(key, g)| (key, Sample::Gauge(f64::from_bits(g.load(Ordering::Relaxed))))))
            .chain(histograms.iter().map(|(key, h)| (key, Sample::Histogram(h))));
        let mut families: BTreeMap<&str, Vec<(&Key, Sample)>> = BTreeMap::new();
        for (key, sample) in samples {
            families.entry(key.name()).or_default().push((key, sample));
        }

        let descriptions = self.descriptions.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::new();
        for (name, mut series) in families {
            let kind = match series.first().map(|(_, sample)| sample) {
                Some(Sample::Counter(_)) | None => "counter",
                Some(Sample::Gauge(_)) => "gauge",
                Some(Sample::Histogram(_)) => "histogram",
            };
            if let Some(help) = descriptions.get(name) {
                let help = help.replace('\\', "\\\\").replace('\n', "\\n");
                let _ = writeln!(out, "# HELP {name} {help}");
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
            series.sort_by(|a, b| {
                a.0.labels().map(|l| (l.key(), l.value())).cmp(b.0.labels().map(|l| (l.key(), l.value())))
            });
            for (key, sample) in series {
                match sample {
                    Sample::Counter(value) => line(&mut out, name, "", key, None, value),
                    Sample::Gauge(value) => line(&mut out, name, "", key, None, value),
                    Sample::Histogram(buckets) => {
                        let mut count = 0;
                        for (i, bound) in SECONDS_BUCKETS.iter().enumerate() {
                            count += buckets.counts[i].load(Ordering::Relaxed);
                            line(&mut out, name, "_bucket", key, Some(bound), count);
                        }
                        count += buckets.counts[SECONDS_BUCKETS.len()].load(Ordering::Relaxed);
                        line(&mut out, name, "_bucket", key, Some(&"+Inf"), count);
                        let sum = f64::from_bits(buckets.sum.load(Ordering::Relaxed));
                        line(&mut out, name, "_sum", key, None, sum);
                        line(&mut out, name, "_count", key, None, count);
                    }
                }
            }
            out.push('\n');
        }
        out
    }

    fn describe(&self, name: KeyName, description: SharedString) {
        let mut descriptions = self.descriptions.lock().unwrap_or_else(PoisonError::into_inner);
        descriptions.insert(name.as_str().to_owned(), description);
    }
}

impl Default for MetricRegistry {
    fn default() -> Self {
        Self::new()
    }
}

enum Sample<'a> {
    Counter(u64),
    Gauge(f64),
    Histogram(&'a Buckets),
}

/// `name{labels,le="bound"} value`, label values escaped as the format asks.
fn line(
    out: &mut String,
    name: &str,
    suffix: &str,
    key: &Key,
    le: Option<&dyn std::fmt::Display>,
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    out.push_str(suffix);
    let mut labels = key.labels().peekable();
    if labels.peek().is_some() || le.is_some() {
        out.push('{');
        let mut first = true;
        for label in labels {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(label.key());
            out.push_str("=\"");
            for c in label.value().chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        if let Some(le) = le {
            if !first {
                out.push(',');
            }
            let _ = write!(out, "le=\"{le}\"");
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

impl Recorder for MetricRegistry {
    fn describe_counter(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_gauge(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_histogram(&self, key: KeyName, _unit: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.registry.get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.registry.get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.registry.get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics::Label;

    fn key(name: &'static str, labels: &[(&'static str, &str)]) -> Key {
        Key::from_parts(name, labels.iter().map(|(k, v)| Label::new(*k, v.to_string())).collect::<Vec<_>>())
    }

    const META: Metadata<'static> = Metadata::new("test", metrics::Level::INFO, None);

    #[test]
    fn renders_prometheus_text() {
        let registry = MetricRegistry::new();
        registry.describe(KeyName::from_const_str("requests_total"), "Requests\nanswered".into());
        registry.register_counter(&key("requests_total", &[("api", "a\"b"), ("status", "200")]), &META).increment(3);
        registry.register_counter(&key("requests_total", &[("api", "a\"b"), ("status", "200")]), &META).increment(1);
        registry.register_gauge(&key("up", &[]), &META).set(0.5);
        let latency = registry.register_histogram(&key("latency_seconds", &[("upstream", "u")]), &META);
        for value in [0.0001, 0.0005, 0.003, 100.0] {
            latency.record(value);
        }
        let text = registry.render();
        let want = [
            "# TYPE latency_seconds histogram",
            "latency_seconds_bucket{upstream=\"u\",le=\"0.0005\"} 2",
            "latency_seconds_bucket{upstream=\"u\",le=\"0.001\"} 2",
            "latency_seconds_bucket{upstream=\"u\",le=\"0.005\"} 3",
            "latency_seconds_bucket{upstream=\"u\",le=\"30\"} 3",
            "latency_seconds_bucket{upstream=\"u\",le=\"+Inf\"} 4",
            "latency_seconds_sum{upstream=\"u\"} 100.0036",
            "latency_seconds_count{upstream=\"u\"} 4",
            "# HELP requests_total Requests\\nanswered",
            "# TYPE requests_total counter",
            "requests_total{api=\"a\\\"b\",status=\"200\"} 4",
            "# TYPE up gauge",
            "up 0.5",
        ];
        for line in want {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        // Metrics in name order.
        let order: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).collect();
        assert_eq!(order, ["latency_seconds histogram", "requests_total counter", "up gauge"]);
    }

    #[test]
    fn forgotten_series_leave_and_come_back_at_zero() {
        let registry = MetricRegistry::new();
        let kept = registry.register_counter(&key("hits_total", &[("api", "kept")]), &META);
        let gone = registry.register_counter(&key("hits_total", &[("api", "gone")]), &META);
        let gauge = registry.register_gauge(&key("healthy", &[("upstream", "gone")]), &META);
        kept.increment(1);
        gone.increment(5);
        gauge.set(1.0);
        registry.forget(|key| key.labels().any(|l| l.value() == "gone"));
        // A held handle still works, unseen.
        gone.increment(1);
        kept.increment(1);
        let text = registry.render();
        assert!(!text.contains("gone"), "{text}");
        assert!(text.contains("hits_total{api=\"kept\"} 2"), "{text}");
        // No series left: no family either.
        assert!(!text.contains("healthy"), "{text}");
        registry.register_counter(&key("hits_total", &[("api", "gone")]), &META).increment(1);
        assert!(registry.render().contains("hits_total{api=\"gone\"} 1"));
    }
}

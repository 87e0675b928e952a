//! The span exporter, a task of the process (not of a proxy worker): takes
//! finished spans off the tracer's queue, turns them into OTLP (the work a
//! request does not wait for), and sends them in batches to the collector's
//! `TraceService/Export`. A failed batch is dropped and counted, not
//! retried: spans are for looking at recent traffic, and a retry would hold
//! the queue while new spans are dropped instead.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::Counter;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span, status};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

use super::{SpanRecord, TraceSettings};
use crate::sync::{Connector, SyncTls};

/// Spans sent in one export call at most.
const BATCH_SPANS: usize = 512;
/// The longest a finished span waits for its batch to fill.
const BATCH_WAIT: Duration = Duration::from_secs(1);
/// One export call's limit, connecting included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("--otlp-endpoint {url}: {reason}")]
    Endpoint { url: String, reason: String },
}

/// Sends the tracer's spans to the collector; [`Exporter::run`] is its task.
pub struct Exporter {
    spans: mpsc::Receiver<SpanRecord>,
    client: TraceServiceClient<Channel>,
    resource: Resource,
    exported: Counter,
    failed: Counter,
    /// The last export failed: the next failure is not logged again.
    failing: bool,
}

impl Exporter {
    pub(super) fn new(settings: &TraceSettings, spans: mpsc::Receiver<SpanRecord>) -> Result<Self, ExportError> {
        let url = settings.endpoint.trim();
        let refused = |reason: String| ExportError::Endpoint { url: url.to_owned(), reason };
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| refused(e.to_string()))?
            .connect_timeout(EXPORT_TIMEOUT)
            .timeout(EXPORT_TIMEOUT);
        // Connected at the first export, and again after a failure: a
        // collector that starts after the data plane is found then.
        let channel = match endpoint.uri().scheme_str() {
            Some("http") => endpoint.connect_lazy(),
            // TLS verified against the system's CAs, on the sync client's connector.
            Some("https") => {
                let connector = Connector::new(url, SyncTls::default()).map_err(|e| refused(e.to_string()))?;
                endpoint.connect_with_connector_lazy(connector)
            }
            _ => return Err(refused("the URL must start with http:// or https://".into())),
        };
        let attribute = |key: &str, value: &str| string(key, value.to_owned());
        let resource = Resource {
            attributes: vec![
                attribute("service.name", &settings.service_name),
                attribute("service.instance.id", &settings.node_id),
                attribute("service.version", env!("CARGO_PKG_VERSION")),
            ],
            ..Default::default()
        };
        Ok(Exporter {
            spans,
            client: TraceServiceClient::new(channel),
            resource,
            exported: metrics::counter!("sluice_trace_spans_exported_total"),
            failed: metrics::counter!("sluice_trace_spans_dropped_total", "reason" => "export_failed"),
            failing: false,
        })
    }

    /// Exports until every tracer is gone (the proxy stopped) and the queue
    /// is empty, so spans of the requests drained at shutdown still go out.
    pub async fn run(mut self) {
        let mut batch = Vec::with_capacity(BATCH_SPANS);
        while let Some(first) = self.spans.recv().await {
            batch.push(to_span(first));
            let deadline = tokio::time::sleep(BATCH_WAIT);
            tokio::pin!(deadline);
            while batch.len() < BATCH_SPANS {
                tokio::select! {
                    next = self.spans.recv() => match next {
                        Some(record) => batch.push(to_span(record)),
                        None => break,
                    },
                    () = &mut deadline => break,
                }
            }
            self.export(std::mem::replace(&mut batch, Vec::with_capacity(BATCH_SPANS))).await;
        }
    }

    async fn export(&mut self, spans: Vec<Span>) {
        let count = spans.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "sluice-data-plane".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        match self.client.export(request).await {
            Ok(response) => {
                // A collector may refuse part of a batch and say how much.
                let rejected =
                    response.into_inner().partial_success.map_or(0, |partial| partial.rejected_spans.max(0) as u64);
                self.exported.increment(count.saturating_sub(rejected));
                self.failed.increment(rejected.min(count));
                if std::mem::take(&mut self.failing) {
                    tracing::info!("span export works again");
                }
            }
            Err(status) => {
                self.failed.increment(count);
                // Once per outage, not once a second: the counter says how much is lost.
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(spans = count, error = %status.message(), code = ?status.code(), "span export failed; batches are dropped until it works again");
                } else {
                    tracing::debug!(spans = count, error = %status.message(), "span export failed");
                }
            }
        }
    }
}

fn string(key: &str, value: String) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value)) }),
        ..Default::default()
    }
}

fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(value)) }),
        ..Default::default()
    }
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
}

/// `flags` bits of an OTLP span (trace.proto, `SpanFlags`): whether the
/// parent is known to be remote or not.
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The OTLP form of a finished span. Attribute names follow OpenTelemetry's
/// HTTP server conventions; Sluice's own start with `sluice.`.
fn to_span(record: SpanRecord) -> Span {
    let SpanRecord { span: active, end } = record;
    let route = end.api.as_ref().map(|api| if api.prefix.is_empty() { "/".to_owned() } else { api.prefix.clone() });
    let method = match end.method.as_str() {
        known @ ("GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS" | "CONNECT" | "TRACE") => known,
        _ => "_OTHER",
    };
    let name = match &route {
        Some(route) => format!("{method} {route}"),
        None => method.to_owned(),
    };
    let mut attributes = vec![
        string("http.request.method", method.to_owned()),
        string("url.scheme", end.scheme.to_owned()),
        string("url.path", end.path.to_string()),
        string("network.protocol.version", protocol_version(end.version).to_owned()),
        string("client.address", end.client.to_string()),
        int("http.response.status_code", i64::from(end.status.as_u16())),
        string("sluice.request_id", end.request_id.as_str().to_owned()),
    ];
    if method == "_OTHER" {
        attributes.push(string("http.request.method_original", end.method.as_str().to_owned()));
    }
    if let Some(host) = end.host {
        attributes.push(string("server.address", host.into()));
    }
    if let Some(agent) = end.user_agent {
        attributes.push(string("user_agent.original", agent.into()));
    }
    if let Some(route) = route {
        attributes.push(string("http.route", route));
    }
    if let Some(api) = &end.api {
        attributes.push(string("sluice.api", api.name.clone()));
        attributes.push(string("sluice.upstream", api.upstream.name.clone()));
    }
    if let Some(consumer) = end.consumer {
        attributes.push(string("sluice.consumer", consumer.to_string()));
    }
    if let Some(target) = end.target {
        attributes.push(string("sluice.upstream.target", target.url.clone()));
    }
    if let Some(status) = end.upstream_status {
        attributes.push(int("sluice.upstream.status_code", i64::from(status.as_u16())));
    }
    if let Some(code) = end.grpc_status {
        attributes.push(int("rpc.grpc.status_code", i64::from(code)));
    }
    // A server span is in error for a 5xx only: a 4xx is the client's.
    let status = if end.status.is_server_error() {
        attributes.push(string("error.type", end.status.as_u16().to_string()));
        Status { code: status::StatusCode::Error as i32, message: String::new() }
    } else {
        Status::default()
    };
    let start = unix_nanos(active.start);
    let duration = u64::try_from(end.elapsed.as_nanos()).unwrap_or(u64::MAX);
    Span {
        trace_id: active.trace_id.to_vec(),
        span_id: active.span_id.to_vec(),
        trace_state: active.trace_state.map(String::from).unwrap_or_default(),
        parent_span_id: active.parent_id.map(|id| id.to_vec()).unwrap_or_default(),
        // Sampled (every exported span is), and whether the parent is remote.
        flags: 0x01 | HAS_IS_REMOTE | if active.parent_id.is_some() { IS_REMOTE } else { 0 },
        name,
        kind: span::SpanKind::Server as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: start.saturating_add(duration),
        attributes,
        status: Some(status),
        ..Default::default()
    }
}

fn protocol_version(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_09 => "0.9",
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

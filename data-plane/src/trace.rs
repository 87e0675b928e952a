//! Distributed tracing, beside the request path and off unless
//! `--otlp-endpoint` is set: W3C trace context in (`traceparent`,
//! `tracestate`), one server span per request, its context out to the
//! upstream, and the finished spans exported over OTLP/gRPC by a task of
//! the process (`export`), never by the request.
//!
//! When tracing is off the proxy holds no [`Tracer`], does nothing here and
//! leaves both headers to pass as any other. When it is on, every request
//! gets a span ID and the upstream a `traceparent` naming it as the parent,
//! sampled or not, so that the upstream's spans hang under the gateway's;
//! only a sampled span is kept and exported.

mod export;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use metrics::Counter;
use tokio::sync::mpsc;

use crate::base::RequestId;
use crate::routing::CompiledApi;
use crate::upstream::Target;

pub use export::{ExportError, Exporter};

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Spans waiting for export. Past it spans are dropped (and counted), never
/// waited for: a collector that is slow or down must not slow requests.
pub const QUEUE_SPANS: usize = 4096;

/// `--service-name` unless set.
pub const DEFAULT_SERVICE_NAME: &str = "sluice-dp";

/// What `sluice-dp`'s tracing flags say.
#[derive(Debug, Clone)]
pub struct TraceSettings {
    /// The collector's OTLP/gRPC URL, `http://` or `https://` (system CAs).
    pub endpoint: String,
    /// Share of new traces sampled, 0 to 1; a client's sampled flag decides for traces it started.
    pub sampling_ratio: f64,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// `service.instance.id`: the node ID.
    pub node_id: String,
}

/// Starts spans and hands finished ones to the exporter.
#[derive(Debug)]
pub struct Tracer {
    /// New traces are sampled when their trace ID's last 63 bits fall under
    /// this, as OpenTelemetry's ratio sampler decides: every data plane of a
    /// fleet samples the same traces.
    threshold: u64,
    queue: mpsc::Sender<SpanRecord>,
    dropped: Counter,
}

/// A W3C `traceparent`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TraceParent {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    sampled: bool,
}

/// A sampled request's span, from its start to its end.
#[derive(Debug)]
pub struct ActiveSpan {
    tracer: Arc<Tracer>,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    /// The client's span (a remote parent); `None` for a trace started here.
    parent_id: Option<[u8; 8]>,
    /// The client's `tracestate`, passed on unchanged.
    trace_state: Option<Box<str>>,
    start: SystemTime,
}

/// What the request path knows of a request when its response has ended,
/// moved (not copied) from its access-log record.
#[derive(Debug)]
pub struct SpanEnd {
    pub elapsed: Duration,
    pub method: Method,
    pub scheme: &'static str,
    pub path: Arc<str>,
    pub version: Version,
    pub client: IpAddr,
    pub host: Option<Box<str>>,
    pub user_agent: Option<Box<str>>,
    pub request_id: RequestId,
    pub api: Option<Arc<CompiledApi>>,
    pub consumer: Option<Arc<str>>,
    pub status: StatusCode,
    pub target: Option<Arc<Target>>,
    pub upstream_status: Option<StatusCode>,
    pub grpc_status: Option<u16>,
}

/// A finished span on its way to the exporter.
#[derive(Debug)]
struct SpanRecord {
    span: Box<ActiveSpan>,
    end: SpanEnd,
}

impl Tracer {
    /// The tracer and its exporter, which the caller runs off the request
    /// path; the URL is checked here, so a mistake fails the start.
    pub fn new(settings: TraceSettings) -> Result<(Arc<Tracer>, Exporter), ExportError> {
        let (queue, spans) = mpsc::channel(QUEUE_SPANS);
        let exporter = Exporter::new(&settings, spans)?;
        let ratio = settings.sampling_ratio.clamp(0.0, 1.0);
        let tracer = Tracer {
            threshold: (ratio * (1u64 << 63) as f64) as u64,
            queue,
            dropped: metrics::counter!("sluice_trace_spans_dropped_total", "reason" => "queue_full"),
        };
        Ok((Arc::new(tracer), exporter))
    }

    /// A request's span: takes the client's trace context when its
    /// `traceparent` is well-formed (else a new trace, and its `tracestate`
    /// goes: it belongs to the context that was refused), and replaces the
    /// header with this span's so that the upstream sees the gateway as its
    /// parent. `None` when the trace is not sampled: the span is not kept.
    pub fn start(self: &Arc<Self>, headers: &mut HeaderMap) -> Option<Box<ActiveSpan>> {
        let (trace_id, parent_id, sampled) = match incoming(headers) {
            Some(parent) => (parent.trace_id, Some(parent.parent_id), parent.sampled),
            None => {
                headers.remove(TRACESTATE);
                let trace_id = random_id::<16>();
                (trace_id, None, self.samples(&trace_id))
            }
        };
        let span_id = random_id::<8>();
        headers.insert(TRACEPARENT, traceparent(&TraceParent { trace_id, parent_id: span_id, sampled }));
        if !sampled {
            return None;
        }
        let trace_state = parent_id.and_then(|_| joined(headers, &TRACESTATE));
        Some(Box::new(ActiveSpan {
            tracer: self.clone(),
            trace_id,
            span_id,
            parent_id,
            trace_state,
            start: SystemTime::now(),
        }))
    }

    fn samples(&self, trace_id: &[u8; 16]) -> bool {
        let mut low = [0; 8];
        low.copy_from_slice(&trace_id[8..]);
        (u64::from_be_bytes(low) >> 1) < self.threshold
    }
}

impl ActiveSpan {
    /// Queues the span for export, or drops it (counted) when the queue is full.
    pub fn end(self: Box<Self>, end: SpanEnd) {
        let tracer = self.tracer.clone();
        if tracer.queue.try_send(SpanRecord { span: self, end }).is_err() {
            tracer.dropped.increment(1);
        }
    }
}

/// The client's trace context: exactly one `traceparent`, well-formed
/// (W3C Trace Context, level 2 §3.2): `version-traceid-parentid-flags` in
/// lower-case hex, version not `ff`, IDs not all zeros. A later version may
/// append fields after a `-`; the four known ones are read.
fn incoming(headers: &HeaderMap) -> Option<TraceParent> {
    let mut values = headers.get_all(TRACEPARENT).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    parse_traceparent(value.as_bytes())
}

fn parse_traceparent(text: &[u8]) -> Option<TraceParent> {
    if text.len() < 55 || text[2] != b'-' || text[35] != b'-' || text[52] != b'-' {
        return None;
    }
    let version = hex_bytes::<1>(&text[..2])?;
    match version[0] {
        0xff => return None,
        0 if text.len() != 55 => return None,
        _ if text.len() > 55 && text[55] != b'-' => return None,
        _ => {}
    }
    let trace_id = hex_bytes::<16>(&text[3..35])?;
    let parent_id = hex_bytes::<8>(&text[36..52])?;
    let flags = hex_bytes::<1>(&text[53..55])?;
    if trace_id == [0; 16] || parent_id == [0; 8] {
        return None;
    }
    Some(TraceParent { trace_id, parent_id, sampled: flags[0] & 1 == 1 })
}

/// Lower-case hex only: the specification refuses upper case.
fn hex_bytes<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    if text.len() != N * 2 {
        return None;
    }
    let mut out = [0; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// `00-<trace id>-<span id>-<flags>`: version 00, only the sampled flag.
fn traceparent(context: &TraceParent) -> HeaderValue {
    let mut text = [0u8; 55];
    text[..3].copy_from_slice(b"00-");
    let written = hex::encode_to_slice(context.trace_id, &mut text[3..35])
        .and_then(|()| hex::encode_to_slice(context.parent_id, &mut text[36..52]));
    debug_assert!(written.is_ok(), "the slices are sized for the IDs");
    text[35] = b'-';
    text[52] = b'-';
    text[53] = b'0';
    text[54] = if context.sampled { b'1' } else { b'0' };
    // Hex digits and dashes are always a valid header value.
    HeaderValue::from_bytes(&text)
        .unwrap_or(HeaderValue::from_static("00-00000000000000000000000000000000-0000000000000000-00"))
}

/// A header's values joined by commas, as list headers combine; `None` if absent or not text.
fn joined(headers: &HeaderMap, name: &HeaderName) -> Option<Box<str>> {
    let mut out = String::new();
    for value in headers.get_all(name) {
        let text = value.to_str().ok()?.trim();
        if text.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(text);
    }
    (!out.is_empty()).then(|| out.into_boxed_str())
}

/// A random ID, never all zeros (which the specification reserves for "none").
fn random_id<const N: usize>() -> [u8; N] {
    loop {
        let id: [u8; N] = rand::random();
        if id != [0; N] {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_parsing_follows_the_specification() {
        let parsed = parse_traceparent(VALID.as_bytes()).unwrap();
        assert_eq!(hex::encode(parsed.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(parsed.parent_id), "00f067aa0ba902b7");
        assert!(parsed.sampled);
        assert!(!parse_traceparent(VALID.replace("-01", "-00").as_bytes()).unwrap().sampled);
        // A later version may add fields; its four known ones are read.
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-ever";
        assert!(parse_traceparent(future.as_bytes()).unwrap().sampled);
        let refused = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ];
        for text in refused {
            assert_eq!(parse_traceparent(text.as_bytes()), None, "{text}");
        }
    }

    #[test]
    fn traceparent_round_trips() {
        let context = TraceParent { trace_id: random_id(), parent_id: random_id(), sampled: true };
        let value = traceparent(&context);
        assert_eq!(parse_traceparent(value.as_bytes()), Some(context));
        let unsampled = TraceParent { sampled: false, ..context };
        assert!(traceparent(&unsampled).to_str().unwrap().ends_with("-00"));
    }

    fn tracer(ratio: f64) -> Arc<Tracer> {
        let (queue, _spans) = mpsc::channel(1);
        Arc::new(Tracer { threshold: (ratio * (1u64 << 63) as f64) as u64, queue, dropped: metrics::Counter::noop() })
    }

    #[test]
    fn a_clients_context_is_continued_and_the_upstream_gets_this_span_as_parent() {
        let tracer = tracer(0.0);
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(VALID));
        headers.append(TRACESTATE, HeaderValue::from_static("a=1"));
        headers.append(TRACESTATE, HeaderValue::from_static("b=2"));
        // Sampled by the client, whatever the ratio.
        let span = tracer.start(&mut headers).unwrap();
        assert_eq!(hex::encode(span.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span.parent_id.map(hex::encode).as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(span.trace_state.as_deref(), Some("a=1,b=2"));
        let sent = parse_traceparent(headers[&TRACEPARENT].as_bytes()).unwrap();
        assert_eq!((sent.trace_id, sent.parent_id, sent.sampled), (span.trace_id, span.span_id, true));
        assert_eq!(headers.get_all(TRACESTATE).iter().count(), 2, "passed on unchanged");
    }

    #[test]
    fn a_malformed_context_starts_a_new_trace_and_drops_its_state() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static("00-zz-bad-01"));
        headers.insert(TRACESTATE, HeaderValue::from_static("a=1"));
        let span = tracer(1.0).start(&mut headers).unwrap();
        assert_eq!(span.parent_id, None);
        assert!(!headers.contains_key(TRACESTATE));
        let sent = parse_traceparent(headers[&TRACEPARENT].as_bytes()).unwrap();
        assert_eq!((sent.trace_id, sent.parent_id), (span.trace_id, span.span_id));
        // Two headers are as bad as a malformed one.
        let mut headers = HeaderMap::new();
        headers.append(TRACEPARENT, HeaderValue::from_static(VALID));
        headers.append(TRACEPARENT, HeaderValue::from_static(VALID));
        assert_eq!(tracer(1.0).start(&mut headers).unwrap().parent_id, None);
    }

    #[test]
    fn unsampled_requests_keep_no_span_but_still_propagate() {
        let mut headers = HeaderMap::new();
        assert!(tracer(0.0).start(&mut headers).is_none());
        let sent = parse_traceparent(headers[&TRACEPARENT].as_bytes()).unwrap();
        assert!(!sent.sampled);
        // A client's unsampled decision is kept too.
        let mut headers = HeaderMap::new();
        headers
            .insert(TRACEPARENT, HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
        assert!(tracer(1.0).start(&mut headers).is_none());
        let sent = parse_traceparent(headers[&TRACEPARENT].as_bytes()).unwrap();
        assert_eq!(hex::encode(sent.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(hex::encode(sent.parent_id), "00f067aa0ba902b7");
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let registry = crate::base::MetricRegistry::new();
        let (queue, mut spans) = mpsc::channel(1);
        let dropped = metrics::with_local_recorder(
            &registry,
            || metrics::counter!("sluice_trace_spans_dropped_total", "reason" => "queue_full"),
        );
        let tracer = Arc::new(Tracer { threshold: u64::MAX, queue, dropped });
        let end = || SpanEnd {
            elapsed: Duration::from_millis(1),
            method: Method::GET,
            scheme: "http",
            path: "/".into(),
            version: Version::HTTP_11,
            client: IpAddr::from([127, 0, 0, 1]),
            host: None,
            user_agent: None,
            request_id: RequestId::make(),
            api: None,
            consumer: None,
            status: StatusCode::OK,
            target: None,
            upstream_status: None,
            grpc_status: None,
        };
        for _ in 0..3 {
            tracer.start(&mut HeaderMap::new()).unwrap().end(end());
        }
        assert!(spans.try_recv().is_ok(), "the first one is queued");
        assert!(spans.try_recv().is_err());
        let text = registry.render();
        assert!(text.contains("sluice_trace_spans_dropped_total{reason=\"queue_full\"} 2"), "{text}");
    }

    #[test]
    fn the_ratio_samples_its_share_of_new_traces() {
        let half = tracer(0.5);
        let sampled = (0..10_000).filter(|_| half.samples(&random_id())).count();
        assert!((4_500..5_500).contains(&sampled), "{sampled}");
        assert!((0..1000).all(|_| tracer(1.0).samples(&random_id())));
        assert!((0..1000).all(|_| !tracer(0.0).samples(&random_id())));
    }
}

//! An OTLP trace collector for tracing tests: a tonic server for the
//! collector's `TraceService` on 127.0.0.1 that keeps every span it is sent,
//! with its resource's attributes, so a test can wait for a request's span
//! and assert on it. Shared by `sluice-dp`'s and `sluice standalone`'s tests.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio_stream::wrappers::TcpListenerStream;

use crate::eventually;

/// A span as the collector received it, with its resource's attributes.
#[derive(Debug, Clone)]
pub struct Received {
    pub span: Span,
    pub resource: HashMap<String, String>,
}

impl Received {
    pub fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }
}

/// An attribute's value as text (strings as they are, integers in decimal).
pub fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()?;
    Some(match value {
        any_value::Value::StringValue(text) => text.clone(),
        any_value::Value::IntValue(n) => n.to_string(),
        other => format!("{other:?}"),
    })
}

/// The collector; clones share the spans received.
#[derive(Clone, Default)]
pub struct Collector {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.spans.lock().map_err(|_| tonic::Status::internal("poisoned"))?;
        for resource_spans in request.into_inner().resource_spans {
            let resource: HashMap<String, String> = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .filter_map(|kv| Some((kv.key.clone(), attribute(std::slice::from_ref(kv), &kv.key)?)))
                .collect();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    kept.push(Received { span, resource: resource.clone() });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// A collector on an ephemeral port, serving until the test's runtime ends;
    /// `http://{addr}` is the `--otlp-endpoint` to give.
    pub async fn start() -> Result<(Collector, SocketAddr)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Ok((collector, addr))
    }

    /// The span of the request whose ID is `request_id`, once it has arrived.
    pub async fn span(&self, request_id: &str) -> Result<Received> {
        let find = || {
            let spans = self.spans.lock().ok()?;
            spans.iter().find(|s| s.attribute("sluice.request_id").as_deref() == Some(request_id)).cloned()
        };
        let arrived = || async { find().is_some() };
        eventually(request_id, Duration::from_millis(50), arrived).await.context("the span never arrived")?;
        find().context("gone")
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().map(|spans| spans.clone()).unwrap_or_default()
    }

    pub fn count(&self) -> usize {
        self.spans.lock().map_or(0, |spans| spans.len())
    }
}

//! Sending one OTLP export: over HTTP/1.1 as OTLP/HTTP protobuf, or over HTTP/2 as OTLP/gRPC (a
//! unary call: the message in one length-prefixed frame, the verdict in the `grpc-status`
//! trailer); http or https (rustls with the ring provider, Mozilla's roots compiled in plus the
//! CAs of `OTEL_EXPORTER_OTLP_CERTIFICATE`, a client certificate for mutual TLS), gzip when
//! asked, the signal's headers, and its timeout over the whole exchange. Each signal has its own
//! client, since each may name its own protocol and TLS files.

use std::io::Write as _;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use rustls::ClientConfig;

use crate::config::{Compression, Endpoint, PemFile};
use crate::publish::tls;

/// The most of a collector's answer that is read (a partial-success message at most).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

pub(super) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The client for one signal's endpoint. Fails, in one line naming the setting, on a TLS file
/// that cannot be read or holds no usable certificate or key: checked at start, so a typo in a
/// path stops the start rather than every export.
pub(super) fn client(endpoint: &Endpoint) -> Result<HttpClient, String> {
    let tls = tls_config(endpoint.certificate.as_ref(), endpoint.client.as_ref())?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if endpoint.grpc {
        // gRPC is HTTP/2 only: ALPN `h2` over TLS, prior knowledge (h2c) over plain TCP.
        let connector = builder.enable_http2().wrap_connector(http);
        Ok(Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build(connector))
    } else {
        let connector = builder.enable_http1().wrap_connector(http);
        Ok(Client::builder(TokioExecutor::new()).build(connector))
    }
}

fn tls_config(
    certificate: Option<&PemFile>,
    client: Option<&(PemFile, PemFile)>,
) -> Result<ClientConfig, String> {
    let ca_label = certificate.map(label);
    let roots = tls::roots(
        certificate
            .map(|f| f.path.as_path())
            .zip(ca_label.as_deref()),
    )?;
    let builder = ClientConfig::builder_with_provider(tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => {
            let der = PrivateKeyDer::from_pem_file(&key.path)
                .map_err(|e| format!("{}: {e}", label(key)))?;
            builder
                .with_client_auth_cert(tls::certificates(&chain.path, &label(chain))?, der)
                .map_err(|e| format!("{}: {e}", label(key)))
        }
    }
}

/// How an error names a TLS file: its setting, then its path.
fn label(file: &PemFile) -> String {
    format!("{}: {}", file.setting, file.path.display())
}

/// The body as it goes on the wire: gzip-compressed when the endpoint asks, and for gRPC in
/// one length-prefixed message frame (a compressed flag byte, the length as four big-endian
/// bytes).
pub(super) fn encode(endpoint: &Endpoint, message: Vec<u8>) -> Bytes {
    let body = compress(endpoint.compression, message);
    if !endpoint.grpc {
        return Bytes::from(body);
    }
    let Ok(len) = u32::try_from(body.len()) else {
        // Past 4 GiB a frame cannot say its length; no export comes near (a batch is at most
        // OTEL_BSP_MAX_EXPORT_BATCH_SIZE spans), and the collector refuses an empty frame.
        return Bytes::new();
    };
    let mut framed = Vec::with_capacity(5 + body.len());
    framed.push(u8::from(endpoint.compression == Compression::Gzip));
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(&body);
    Bytes::from(framed)
}

fn compress(compression: Compression, body: Vec<u8>) -> Vec<u8> {
    match compression {
        Compression::None => body,
        Compression::Gzip => {
            // Fast level: a body is protobuf of a few KB to a few hundred KB, sent from a
            // thread that must keep up with the spans of every request.
            let mut gz = flate2::write::GzEncoder::new(
                Vec::with_capacity(body.len() / 4),
                flate2::Compression::fast(),
            );
            // Writing to a Vec cannot fail.
            let _ = gz.write_all(&body);
            gz.finish().unwrap_or_default()
        }
    }
}

/// Sends one body; any answer but 2xx, or none within the endpoint's timeout, is an error.
pub(super) async fn post(
    client: &HttpClient,
    endpoint: &Endpoint,
    body: Bytes,
) -> Result<(), String> {
    let gzip = endpoint.compression == Compression::Gzip;
    let mut request = http::Request::post(endpoint.to_string());
    request = if endpoint.grpc {
        request
            .version(http::Version::HTTP_2)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
    } else {
        request.header(http::header::CONTENT_TYPE, "application/x-protobuf")
    };
    if gzip {
        let name = if endpoint.grpc {
            "grpc-encoding"
        } else {
            "content-encoding"
        };
        request = request.header(name, "gzip");
    }
    for (name, value) in &endpoint.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let request = request.body(Full::new(body)).map_err(|e| e.to_string())?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let (head, body) = response.into_parts();
        // Read the answer (bounded) so the connection can be reused, and for gRPC its trailers.
        let answer = Limited::new(body, MAX_ANSWER_BYTES).collect().await;
        if !status.is_success() {
            return Err(format!("the collector answered {status}"));
        }
        if !endpoint.grpc {
            return Ok(());
        }
        // The verdict is the `grpc-status` trailer, or a header of a trailers-only answer.
        let trailers = answer.ok().and_then(|a| a.trailers().cloned());
        let field = |name: &str| {
            trailers
                .as_ref()
                .and_then(|t| t.get(name))
                .or_else(|| head.headers.get(name))
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        match field("grpc-status").as_deref() {
            Some("0") => Ok(()),
            Some(code) => Err(format!(
                "the collector answered grpc-status {code}: {}",
                field("grpc-message").unwrap_or_default()
            )),
            None => Err("the collector's answer has no grpc-status".into()),
        }
    };
    match tokio::time::timeout(endpoint.timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(endpoint.timeout)
        )),
    }
}

//! The TLS side of bench's client: rustls with the ring provider, trusting Mozilla's roots
//! (compiled in, so a container needs no CA bundle) plus the CAs of `--ca-cert`, or nothing at
//! all with `--insecure`.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The client configuration for `--ca-cert` and `--insecure`; an unreadable or empty CA file
/// is an error that names it.
pub fn client_config(ca_cert: Option<&Path>, insecure: bool) -> Result<ClientConfig, String> {
    // ring, not aws-lc-rs: no cmake or large C build. rustls deprecates it for lacking
    // post-quantum key exchange, which protects recorded traffic for decades; a benchmark's
    // prompts are not such a secret.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    if insecure {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth());
    }
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_cert {
        let name = path.display();
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("--ca-cert {name}: {e}"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--ca-cert {name}: {e}"))?;
        if certs.is_empty() {
            return Err(format!("--ca-cert {name}: no PEM certificate in it"));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("--ca-cert {name}: {e}"))?;
        }
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// `--insecure`: any certificate for any name is accepted, but the handshake's signatures are
/// still checked, so the connection is at least made with the key the server presented.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

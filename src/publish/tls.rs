//! The TLS client side of tokenmeter's outgoing connections (the OTLP exporter, `bench`'s
//! client): rustls with the ring provider, trusting Mozilla's roots (compiled in, so a container
//! needs no CA bundle) and the CAs of a PEM file the user names. One place, so both trust the
//! same roots and refuse a CA file the same way.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

/// The crypto provider: ring, not aws-lc-rs, so no cmake or large C build. rustls deprecates
/// it for lacking post-quantum key exchange, which protects recorded traffic for decades;
/// telemetry and a benchmark's prompts are not such secrets.
pub fn provider() -> Arc<CryptoProvider> {
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Mozilla's roots, and the CAs in `ca` when given. Errors start with `label`, which names
/// the setting and the file.
pub fn roots(ca: Option<(&Path, &str)>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some((path, label)) = ca {
        for cert in certificates(path, label)? {
            roots.add(cert).map_err(|e| format!("{label}: {e}"))?;
        }
    }
    Ok(roots)
}

/// Every certificate of a PEM file; a file that cannot be read or holds none is an error
/// starting with `label`.
pub fn certificates(path: &Path, label: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{label}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{label}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{label}: no PEM certificate in it"));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_is_missing_or_holds_no_certificate_is_refused_by_its_label() {
        let dir = std::env::temp_dir().join(format!("tokenmeter-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = roots(Some((&empty, "otel.certificate: empty.pem"))).unwrap_err();
        assert_eq!(err, "otel.certificate: empty.pem: no PEM certificate in it");
        let err = roots(Some((&dir.join("missing.pem"), "--ca-cert missing.pem"))).unwrap_err();
        assert!(err.starts_with("--ca-cert missing.pem: "), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
        // Without a file: Mozilla's roots alone.
        assert_eq!(
            roots(None).unwrap().len(),
            webpki_roots::TLS_SERVER_ROOTS.len()
        );
    }
}

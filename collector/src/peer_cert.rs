//! The names of a TLS client certificate that credentials are matched
//! against. The certificate has already been verified against
//! `tls.client_ca` by the TLS layer; this only reads names from it.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// A client certificate's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert {
    /// The subject, RFC 4514 style (`CN=agent-1, O=Acme`).
    pub subject: String,
    /// The subject's common name, if any.
    pub cn: Option<String>,
    /// Subject alternative names: DNS names, URIs, e-mail addresses and IP
    /// addresses, as text.
    pub sans: Vec<String>,
}

/// A certificate that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("unreadable client certificate: {0}")]
pub struct CertError(String);

impl PeerCert {
    /// Reads the names of a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, CertError> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| CertError(e.to_string()))?;
        let subject = cert.subject().to_string();
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .map(str::to_string);
        let mut sans = Vec::new();
        if let Ok(Some(ext)) = cert.subject_alternative_name() {
            for n in &ext.value.general_names {
                match n {
                    GeneralName::DNSName(s) | GeneralName::URI(s) | GeneralName::RFC822Name(s) => {
                        sans.push(s.to_string())
                    }
                    GeneralName::IPAddress(b) => {
                        let ip = match b.len() {
                            4 => <[u8; 4]>::try_from(*b).ok().map(std::net::IpAddr::from),
                            16 => <[u8; 16]>::try_from(*b).ok().map(std::net::IpAddr::from),
                            _ => None,
                        };
                        sans.extend(ip.map(|ip| ip.to_string()));
                    }
                    _ => {}
                }
            }
        }
        Ok(PeerCert { subject, cn, sans })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(PeerCert::from_der(b"not a certificate").is_err());
        assert!(PeerCert::from_der(&[]).is_err());
    }
}

//! A throwaway PKI for TLS tests: a CA, server certificates for loopback
//! and client certificates with chosen names, written as PEM files.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};

/// A certificate authority whose files live in a directory.
pub struct Pki {
    dir: PathBuf,
    name: String,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

fn san(s: &str) -> SanType {
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        SanType::IpAddress(ip)
    } else if s.contains("://") {
        SanType::URI(s.try_into().expect("ASCII URI"))
    } else {
        SanType::DnsName(s.try_into().expect("ASCII DNS name"))
    }
}

impl Pki {
    /// A new CA named `name`, its files under `dir`.
    pub fn new(dir: &Path, name: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("{name} test CA"));
        params.distinguished_name = dn;
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pki = Pki {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            ca,
        };
        std::fs::write(pki.ca_file(), pki.ca.pem()).unwrap();
        pki
    }

    /// The CA certificate (PEM file).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.crt", self.name))
    }

    fn issue(
        &self,
        file: &str,
        cn: &str,
        sans: &[&str],
        eku: ExtendedKeyUsagePurpose,
    ) -> CertFiles {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans.iter().map(|s| san(s)).collect();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        dn.push(DnType::OrganizationName, "flopwatch tests");
        params.distinguished_name = dn;
        params.extended_key_usages = vec![eku];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    pub fn server(&self, file: &str) -> CertFiles {
        self.issue(
            file,
            "localhost",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate with common name `cn` and subject alternative
    /// names `sans` (DNS names, `scheme://` URIs, IP addresses).
    pub fn client(&self, file: &str, cn: &str, sans: &[&str]) -> CertFiles {
        self.issue(file, cn, sans, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

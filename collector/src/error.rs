//! The collector's errors, and the one place they become gRPC statuses.

use crate::auth::AuthError;
use crate::store::StoreError;
use tonic::{Code, Status};

/// Anything that can go wrong serving a request.
#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    /// Authentication or authorization.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// Storage failed; the client may retry.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The request is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The thing asked for does not exist (or is not visible).
    #[error("{0}")]
    NotFound(String),
    /// Over a limit.
    #[error("{0}")]
    Exhausted(String),
    /// Opening the collector failed.
    #[error("{0}")]
    Setup(String),
}

impl CollectorError {
    /// The gRPC code for this error.
    pub fn code(&self) -> Code {
        match self {
            CollectorError::Auth(AuthError::Unauthenticated) => Code::Unauthenticated,
            CollectorError::Auth(AuthError::Denied) => Code::PermissionDenied,
            CollectorError::Store(_) => Code::Unavailable,
            CollectorError::Invalid(_) => Code::InvalidArgument,
            CollectorError::NotFound(_) => Code::NotFound,
            CollectorError::Exhausted(_) => Code::ResourceExhausted,
            CollectorError::Setup(_) => Code::Internal,
        }
    }
}

impl From<CollectorError> for Status {
    fn from(e: CollectorError) -> Status {
        let code = e.code();
        match e {
            // Storage details stay in our logs.
            CollectorError::Store(s) => {
                tracing::warn!(error = %s, "storage error");
                Status::new(code, "storage unavailable, retry")
            }
            other => Status::new(code, other.to_string()),
        }
    }
}

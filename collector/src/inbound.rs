//! The Ingest stream's wire, read and written without per-stream buffers
//! that outlive a message.
//!
//! An agent that has backed off sends one batch every few seconds, and a
//! collector holds one stream per agent. tonic's `Streaming` appends every
//! frame to a buffer that keeps the capacity of the largest message it
//! ever held (doubled as it grew): about 66 KiB per stream, at 10,000
//! streams most of the collector's memory, for a buffer that is empty
//! between batches. Here a message that arrives whole in one HTTP/2 DATA
//! frame is decoded from that frame without a copy; one split across frames
//! is gathered into a buffer of exactly its length; and once a message is
//! taken, nothing is kept. The answers (Welcome, Acks, Rejects) are a few
//! dozen bytes each, so their encoder starts from [`ENCODE_BUFFER`] instead
//! of tonic's 8 KiB.
//!
//! Everything else is gRPC over HTTP/2 as tonic serves it: the same
//! statuses for a compressed message (no compression is accepted), an
//! oversize one and a truncated stream, and the response encoded by tonic.

use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio_stream::Stream;
use tonic::codegen::http;
use tonic::Status;

/// gRPC's message prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// The response encoder's starting buffer (it grows when a message needs
/// more, and each encoded message is handed to HTTP/2 as its own bytes).
pub(crate) const ENCODE_BUFFER: usize = 256;

/// Cuts gRPC length-prefixed messages out of a request body's DATA frames.
#[derive(Debug)]
pub(crate) struct Framer {
    /// Whole frames not yet cut, and the bytes of a message split across
    /// frames; both empty (and holding no memory) between messages.
    frames: VecDeque<Bytes>,
    /// Bytes in `frames`.
    held: usize,
    /// The body length of the message whose prefix has been read.
    want: Option<usize>,
    /// Largest message accepted.
    max: usize,
}

impl Framer {
    /// A framer refusing messages over `max` bytes.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            frames: VecDeque::new(),
            held: 0,
            want: None,
            max,
        }
    }

    /// Adds a DATA frame's bytes.
    pub(crate) fn push(&mut self, data: Bytes) {
        if !data.is_empty() {
            self.held += data.len();
            self.frames.push_back(data);
        }
    }

    /// Whether bytes of an unfinished message are held.
    pub(crate) fn is_partial(&self) -> bool {
        self.held > 0 || self.want.is_some()
    }

    /// Bytes of memory held beyond the framer itself.
    #[cfg(test)]
    pub(crate) fn held_capacity(&self) -> usize {
        self.frames.capacity() * std::mem::size_of::<Bytes>() + self.held
    }

    /// The next whole message's bytes, `None` until one is complete, or the
    /// status that ends the stream (an oversize or compressed message).
    pub(crate) fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        let len = match self.want {
            Some(len) => len,
            None => {
                if self.held < PREFIX {
                    return Ok(None);
                }
                let prefix = self.take(PREFIX);
                match prefix[0] {
                    0 => {}
                    // https://grpc.github.io/grpc/core/md_doc_compression.html:
                    // a compressed flag without a grpc-encoding is INTERNAL.
                    1 => {
                        return Err(Status::internal(
                            "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                        ))
                    }
                    f => {
                        return Err(Status::internal(format!(
                            "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1)"
                        )))
                    }
                }
                let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
                if len > self.max {
                    return Err(Status::out_of_range(format!(
                        "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                        self.max
                    )));
                }
                self.want = Some(len);
                len
            }
        };
        if self.held < len {
            return Ok(None);
        }
        self.want = None;
        Ok(Some(self.take(len)))
    }

    /// Removes `n ≤ held` bytes from the front: a slice of the first frame
    /// when it holds them all, else a copy of exactly `n` bytes.
    fn take(&mut self, n: usize) -> Bytes {
        self.held -= n;
        let out = match self.frames.front_mut() {
            Some(first) if first.len() >= n => {
                let out = first.split_to(n);
                if first.is_empty() {
                    self.frames.pop_front();
                }
                out
            }
            _ => {
                let mut out = BytesMut::with_capacity(n);
                while out.len() < n {
                    let Some(first) = self.frames.front_mut() else {
                        break;
                    };
                    let part = first.len().min(n - out.len());
                    out.extend_from_slice(&first[..part]);
                    first.advance(part);
                    if first.is_empty() {
                        self.frames.pop_front();
                    }
                }
                out.freeze()
            }
        };
        if self.frames.is_empty() {
            // A queue that once held many frames gives its slots back.
            self.frames = VecDeque::new();
        }
        out
    }
}

/// What a request's messages decode to.
pub(crate) trait Decode: Sized {
    /// Decodes one message.
    fn decode(bytes: Bytes) -> Result<Self, String>;
}

/// An agent's message, its batch decoded straight into the model's types
/// (`flopwatch_proto::wire_batch`).
impl Decode for flopwatch_proto::wire_batch::AgentFrame {
    fn decode(bytes: Bytes) -> Result<Self, String> {
        Self::decode(&bytes).map_err(|e| e.to_string())
    }
}

/// A request body as a stream of decoded messages.
pub(crate) struct Messages<M, B> {
    body: B,
    framer: Framer,
    ended: bool,
    _message: std::marker::PhantomData<fn() -> M>,
}

impl<M, B> Messages<M, B> {
    /// Decodes `body`, refusing messages over `max` bytes.
    pub(crate) fn new(body: B, max: usize) -> Self {
        Self {
            body,
            framer: Framer::new(max),
            ended: false,
            _message: std::marker::PhantomData,
        }
    }
}

impl<M, B> Stream for Messages<M, B>
where
    M: Decode,
    B: tonic::codegen::Body<Data = Bytes, Error = Status> + Unpin,
{
    type Item = Result<M, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            match this.framer.next_message() {
                Ok(Some(bytes)) => {
                    return Poll::Ready(Some(M::decode(bytes).map_err(Status::internal)))
                }
                Ok(None) => {}
                Err(status) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(status)));
                }
            }
            match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    // Trailers on a request carry nothing the service reads.
                    if let Ok(data) = frame.into_data() {
                        this.framer.push(data);
                    }
                }
                // The agent resetting its stream ends it, as with tonic.
                Some(Err(status)) if status.code() == tonic::Code::Cancelled => {
                    this.ended = true;
                }
                Some(Err(status)) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(status)));
                }
                None => {
                    this.ended = true;
                    if this.framer.is_partial() {
                        return Poll::Ready(Some(Err(Status::internal(
                            "Unexpected EOF decoding stream.",
                        ))));
                    }
                }
            }
        }
    }
}

/// The response to a streaming call: the service's messages encoded by
/// tonic's encoder with a small buffer, then the trailers.
pub(crate) fn streaming_response<M, S>(
    response: Result<tonic::Response<S>, Status>,
) -> http::Response<tonic::body::Body>
where
    M: prost::Message + Send + 'static,
    S: Stream<Item = Result<M, Status>> + Send + 'static,
{
    let response = match response {
        Ok(r) => r,
        Err(status) => return status.into_http(),
    };
    let (metadata, messages, extensions) = response.into_parts();
    let encoder = tonic_prost::ProstEncoder::<M>::new(tonic::codec::BufferSettings::new(
        ENCODE_BUFFER,
        // tonic's default yield threshold.
        32 << 10,
    ));
    let body = tonic::codec::EncodeBody::new_server(
        encoder,
        messages,
        None,
        tonic::codec::SingleMessageCompressionOverride::default(),
        None,
    );
    let mut http = http::Response::new(tonic::body::Body::new(body));
    *http.headers_mut() = metadata.into_headers();
    *http.extensions_mut() = extensions;
    http.headers_mut().insert(
        http::header::CONTENT_TYPE,
        tonic::metadata::GRPC_CONTENT_TYPE,
    );
    http
}

/// The request's messages, refusing a `grpc-encoding` other than identity
/// with UNIMPLEMENTED, as tonic does with no compression enabled.
pub(crate) fn streaming_request<M>(
    request: http::Request<tonic::body::Body>,
    max: usize,
) -> Result<tonic::Request<Messages<M, tonic::body::Body>>, Status> {
    if let Some(encoding) = request.headers().get("grpc-encoding") {
        if encoding.as_bytes() != b"identity" {
            let mut status = Status::unimplemented(format!(
                "Content is compressed with `{}` which isn't supported",
                String::from_utf8_lossy(encoding.as_bytes())
            ));
            status.metadata_mut().insert(
                "grpc-accept-encoding",
                tonic::metadata::MetadataValue::from_static("identity"),
            );
            return Err(status);
        }
    }
    let (parts, body) = request.into_parts();
    Ok(tonic::Request::from_parts(
        tonic::metadata::MetadataMap::from_headers(parts.headers),
        parts.extensions,
        Messages::new(body, max),
    ))
}

/// The answer to a path the service does not have.
pub(crate) fn unimplemented() -> http::Response<tonic::body::Body> {
    let mut response = http::Response::new(tonic::body::Body::default());
    response.headers_mut().insert(
        tonic::Status::GRPC_STATUS,
        (tonic::Code::Unimplemented as i32).into(),
    );
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        tonic::metadata::GRPC_CONTENT_TYPE,
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(messages: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.push(0);
            out.extend_from_slice(&(m.len() as u32).to_be_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    fn drain(f: &mut Framer) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(m) = f.next_message().unwrap() {
            out.push(m.to_vec());
        }
        out
    }

    #[test]
    fn a_message_in_one_frame_is_cut_without_a_copy() {
        let wire = Bytes::from(framed(&[b"hello".to_vec(), b"world!".to_vec()]));
        let start = wire.as_ptr() as usize;
        let mut f = Framer::new(1 << 20);
        f.push(wire.clone());
        let first = f.next_message().unwrap().unwrap();
        assert_eq!(&first[..], b"hello");
        assert_eq!(
            first.as_ptr() as usize,
            start + PREFIX,
            "a slice of the frame"
        );
        assert_eq!(&f.next_message().unwrap().unwrap()[..], b"world!");
        assert!(f.next_message().unwrap().is_none());
        assert!(!f.is_partial());
        assert_eq!(f.held_capacity(), 0, "nothing kept between messages");
    }

    #[test]
    fn nothing_is_kept_after_a_message_split_across_frames() {
        let body = vec![7u8; 40_000];
        let wire = framed(std::slice::from_ref(&body));
        let mut f = Framer::new(1 << 20);
        for chunk in wire.chunks(16_384) {
            assert!(f.next_message().unwrap().is_none());
            f.push(Bytes::copy_from_slice(chunk));
        }
        assert_eq!(f.next_message().unwrap().unwrap().to_vec(), body);
        assert!(!f.is_partial());
        assert_eq!(f.held_capacity(), 0);
    }

    #[test]
    fn an_oversize_message_is_out_of_range_before_its_body_arrives() {
        let mut f = Framer::new(100);
        f.push(Bytes::from(vec![0, 0, 0, 0, 101]));
        let e = f.next_message().unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert!(
            e.message().contains("found 101 bytes, the limit is: 100"),
            "{}",
            e.message()
        );
        let mut f = Framer::new(100);
        f.push(Bytes::from(framed(&[vec![1; 100]])));
        assert_eq!(
            f.next_message().unwrap().unwrap().len(),
            100,
            "the limit itself is accepted"
        );
    }

    #[test]
    fn a_compressed_or_unknown_flag_is_internal() {
        for flag in [1u8, 2, 255] {
            let mut f = Framer::new(100);
            f.push(Bytes::from(vec![flag, 0, 0, 0, 1, 9]));
            assert_eq!(
                f.next_message().unwrap_err().code(),
                tonic::Code::Internal,
                "flag {flag}"
            );
        }
    }

    #[test]
    fn an_empty_message_is_a_message() {
        let mut f = Framer::new(100);
        f.push(Bytes::from(framed(&[Vec::new(), b"x".to_vec()])));
        assert_eq!(drain(&mut f), vec![Vec::new(), b"x".to_vec()]);
    }

    proptest! {
        /// Whatever the frame boundaries, the same messages come out, in
        /// order, and nothing is held once the last is taken.
        #[test]
        fn frames_cut_anywhere_give_the_same_messages(
            messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            cuts in proptest::collection::vec(1usize..64, 0..40),
        ) {
            let wire = framed(&messages);
            let mut f = Framer::new(1 << 20);
            let mut got = Vec::new();
            let mut at = 0;
            for c in cuts.iter().cycle().take(wire.len() + 1) {
                if at >= wire.len() {
                    break;
                }
                let end = (at + c).min(wire.len());
                f.push(Bytes::copy_from_slice(&wire[at..end]));
                at = end;
                got.extend(drain(&mut f));
            }
            if at < wire.len() {
                f.push(Bytes::copy_from_slice(&wire[at..]));
            }
            got.extend(drain(&mut f));
            prop_assert_eq!(got, messages);
            prop_assert!(!f.is_partial());
            prop_assert_eq!(f.held_capacity(), 0);
        }
    }
}

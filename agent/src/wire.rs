//! The agent's messages on the ingest stream, with the batch shared rather
//! than copied.
//!
//! The outbox keeps every batch until the collector acknowledges it, to
//! send it again on another stream if this one ends. tonic's generated
//! client takes each `AgentMessage` by value, so sending meant a deep copy
//! of the batch (its series, their label strings and sample arrays) and one
//! more drop, at every batch. [`Outgoing`] holds the outbox's `Arc` instead,
//! and [`OutgoingCodec`] writes for it the bytes prost writes for the
//! `AgentMessage` it stands for (the test below holds it to that), so the
//! collector sees no difference. Answers are decoded by prost as before.

use flopwatch_proto::v1;
use prost::bytes::BufMut;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;
use std::sync::Arc;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::Status;

/// An `AgentMessage` as the agent sends it.
#[derive(Debug, Clone)]
pub(crate) enum Outgoing {
    /// `AgentMessage.hello` (field 1).
    Hello(Box<v1::Hello>),
    /// `AgentMessage.batch` (field 2), shared with the outbox.
    Batch(Arc<v1::Batch>),
}

impl Outgoing {
    /// The protobuf encoding of the `AgentMessage` with this one field of
    /// its `msg` set.
    pub(crate) fn encode(&self, buf: &mut impl BufMut) -> Result<(), prost::EncodeError> {
        match self {
            Self::Hello(h) => field(1, h.as_ref(), buf),
            Self::Batch(b) => field(2, b.as_ref(), buf),
        }
    }
}

/// A length-delimited field `tag` holding `m`.
fn field(tag: u32, m: &impl Message, buf: &mut impl BufMut) -> Result<(), prost::EncodeError> {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(m.encoded_len() as u64, buf);
    m.encode(buf)
}

/// Opens `Ingest/Stream` on `channel` as the generated client does, with
/// [`OutgoingCodec`]; answers up to `max_decoding` bytes.
pub(crate) async fn open(
    channel: tonic::transport::Channel,
    request: tonic::Request<impl futures::Stream<Item = Outgoing> + Send + 'static>,
    max_decoding: usize,
) -> Result<tonic::codec::Streaming<v1::CollectorMessage>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(max_decoding);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("service was not ready: {e}")))?;
    let mut request = request;
    request
        .extensions_mut()
        .insert(tonic::GrpcMethod::new("flopwatch.v1.Ingest", "Stream"));
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/flopwatch.v1.Ingest/Stream");
    Ok(grpc
        .streaming(request, path, OutgoingCodec)
        .await?
        .into_inner())
}

/// The ingest stream's codec: [`Outgoing`] out, `CollectorMessage` in.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OutgoingCodec;

/// Writes an [`Outgoing`] into tonic's frame buffer.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OutgoingEncoder;

impl Encoder for OutgoingEncoder {
    type Item = Outgoing;
    type Error = Status;

    fn encode(&mut self, item: Outgoing, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }
}

impl Codec for OutgoingCodec {
    type Encode = Outgoing;
    type Decode = v1::CollectorMessage;
    type Encoder = OutgoingEncoder;
    type Decoder = tonic_prost::ProstDecoder<v1::CollectorMessage>;

    fn encoder(&mut self) -> Self::Encoder {
        OutgoingEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<v1::AgentMessage, v1::CollectorMessage>::default().decoder()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use v1::agent_message::Msg;

    fn batch() -> v1::Batch {
        v1::Batch {
            seq: 300,
            agent_id: "node-a".into(),
            uncertain: true,
            series: vec![v1::Series {
                gpu_uuid: "GPU-1".into(),
                metric: flopwatch_proto::metrics::TENSOR_ACTIVE.into(),
                timestamps_ms: (0..200).map(|i| 1_700_000_000_000 + i * 100).collect(),
                values: (0..200).map(|i| f64::from(i) / 200.0).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_bytes_are_those_of_the_agent_message() {
        let hello = v1::Hello {
            agent_id: "node-a".into(),
            ..Default::default()
        };
        for (ours, theirs) in [
            (Outgoing::Hello(Box::new(hello.clone())), Msg::Hello(hello)),
            (Outgoing::Batch(Arc::new(batch())), Msg::Batch(batch())),
            (
                Outgoing::Batch(Arc::new(v1::Batch::default())),
                Msg::Batch(v1::Batch::default()),
            ),
        ] {
            let mut buf = Vec::new();
            ours.encode(&mut buf).unwrap();
            let want = v1::AgentMessage { msg: Some(theirs) }.encode_to_vec();
            assert_eq!(buf, want);
            assert!(!buf.is_empty());
        }
    }
}

#!/usr/bin/env python3
"""A flopwatch client in Python, generated from proto/ alone.

Streams one batch to a collector, waits for its ack, then queries the GPU's
OFU. Shows the protocol is usable from any gRPC language:

    pip install grpcio grpcio-tools
    python3 deploy/examples/python_client.py http://127.0.0.1:7070 [TOKEN]
"""
import os
import sys
import tempfile
import time

from grpc_tools import protoc
import grpc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")
OUT = tempfile.mkdtemp(prefix="flopwatch-py-")
rc = protoc.main(["protoc", f"-I{ROOT}", f"--python_out={OUT}", f"--grpc_python_out={OUT}",
                  os.path.join(ROOT, "flopwatch", "v1", "flopwatch.proto")])
if rc != 0:
    sys.exit("protoc failed")
sys.path.insert(0, OUT)
from flopwatch.v1 import flopwatch_pb2 as pb  # noqa: E402
from flopwatch.v1 import flopwatch_pb2_grpc as rpc  # noqa: E402


def main():
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7070"
    token = sys.argv[2] if len(sys.argv) > 2 else None
    target = url.split("://", 1)[-1]
    meta = [("authorization", f"Bearer {token}")] if token else []
    channel = grpc.insecure_channel(target)
    gpu = "GPU-python-0000"
    now = int(time.time() * 1000)
    ts = [now - 1000 + 100 * i for i in range(10)]

    def messages():
        yield pb.AgentMessage(hello=pb.Hello(
            agent_id="py-node", protocol_version=1,
            node=pb.NodeIdentity(node_id="py-node", hostname="py-node", boot_id="py-boot"),
            gpus=[pb.GpuInfo(index=0, uuid=gpu, model="NVIDIA H100 80GB HBM3")]))
        yield pb.AgentMessage(batch=pb.Batch(seq=int(now), series=[
            pb.Series(gpu_uuid=gpu, metric="tensor_active", timestamps_ms=ts,
                      values=[0.75] * 10, window_ms=[100] * 10),
            pb.Series(gpu_uuid=gpu, metric="sm_clock_avg_mhz", timestamps_ms=ts,
                      values=[1352.0] * 10, window_ms=[100] * 10),
        ]))
        # Keep the stream open until the ack is read.
        time.sleep(1.0)

    ingest = rpc.IngestStub(channel)
    for reply in ingest.Stream(messages(), metadata=meta):
        kind = reply.WhichOneof("msg")
        print(kind, getattr(reply, kind))
        if kind in ("ack", "reject"):
            break

    query = rpc.QueryStub(channel)
    r = query.Ofu(pb.OfuRequest(gpu_uuid=gpu, start_ms=now - 60_000), metadata=meta)
    print(f"OFU {r.summary.mean * 100:.2f} % over {r.summary.samples} samples "
          f"(expected 0.75 × 1352/1830 = {0.75 * 1352 / 1830 * 100:.2f} %)")


if __name__ == "__main__":
    main()

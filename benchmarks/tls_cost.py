"""The cost of TLS and of the data-plane proof: lock-step RPC Echo and connect + handshake
against an in-process `MasterServer` (TCP), and 16 MiB and 4 KiB transfers through a
`TransferServer` over loopback, each plain and with mutual TLS, in the same run.

    .venv/bin/python benchmarks/tls_cost.py [--rounds 5] [--calls 5000] [--connects 100]
                                            [--transfers 20]

Cases alternate (plain, TLS, plain, TLS) so that a shared machine's drift shows as the spread
between two runs of one case. Certificates are a throwaway CA and one ECDSA P-256 certificate
(needs the `cryptography` package). Prints tables; asserts nothing (docs/parts/perf-security.md
has a reading).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import statistics
import tempfile
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from auth_cost import lock_step  # benchmarks/auth_cost.py: the same lock-step loop
from kvpool.master.config import MasterConfig
from kvpool.master.server import MasterServer
from kvpool.rpc import ServerThread
from kvpool.rpc.tls import TlsConfig
from kvpool.transfer import (
    SegmentLocation,
    SegmentMemory,
    TransferEngine,
    TransferOp,
    TransferRequest,
    TransferServer,
)

MiB = 1 << 20
KEY = b"k" * 32


def make_pki(tmp: Path) -> TlsConfig:
    """A CA and a certificate for 127.0.0.1 signed by it, as PEM files under `tmp`."""
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench")]))
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (tmp / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return TlsConfig(str(tmp / "cert.pem"), str(tmp / "key.pem"), str(tmp / "ca.pem"))


def rpc_row(tls: TlsConfig | None, rounds: int, calls: int, connects: int) -> str:
    os.environ["KVPOOL_RPC_UNIX"] = "0"
    files = {"tls_cert": tls.cert, "tls_key": tls.key, "tls_ca": tls.ca} if tls else {}
    st = ServerThread(MasterServer(MasterConfig(port=0, **files))).start()
    ctx = tls.client_context() if tls is not None else None
    try:
        rate, connect = lock_step(st.endpoint, rounds, calls, connects, tls=ctx)
    finally:
        st.stop()
    return f"| {'mutual TLS' if tls else 'plain'} | {rate / 1000:.1f}k calls/s | {connect:.0f} µs |"


def transfer_row(tls: TlsConfig | None, proof: bool, transfers: int) -> str:
    size = 64 * MiB
    mem = SegmentMemory.create("bench-tls", size)
    server = TransferServer(
        tls=tls.server_context() if tls else None,
        data_key=(lambda: KEY) if proof else None,
    )
    server.add_segment(mem)
    loc = SegmentLocation("bench-tls", size, "elsewhere", server.endpoint, "")
    engine = TransferEngine(
        lambda _n: loc,
        "tcp",
        tls=tls.client_context() if tls else None,
        data_key=(lambda: KEY) if proof else None,
    )
    big = bytearray(os.urandom(16 * MiB))
    small = bytearray(4096)
    try:
        w, r = [], []
        for i in range(transfers + 2):
            t0 = time.perf_counter()
            engine.transfer([TransferRequest(TransferOp.WRITE, big, "bench-tls", 0)])
            t1 = time.perf_counter()
            engine.transfer([TransferRequest(TransferOp.READ, big, "bench-tls", 16 * MiB)])
            t2 = time.perf_counter()
            if i >= 2:  # the first two warm the connections
                w.append(16 * MiB / (t1 - t0) / 1e9)
                r.append(16 * MiB / (t2 - t1) / 1e9)
        lat = []
        for _ in range(2000):
            t0 = time.perf_counter()
            engine.transfer([TransferRequest(TransferOp.READ, small, "bench-tls", 0)])
            lat.append((time.perf_counter() - t0) * 1e6)
    finally:
        engine.close()
        server.close()
        mem.close()
    return (
        f"| {'mutual TLS' if tls else 'plain'} | {'yes' if proof else 'no'} "
        f"| {statistics.median(w):.2f} GB/s | {statistics.median(r):.2f} GB/s "
        f"| {statistics.median(lat):.0f} µs |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--connects", type=int, default=100)
    parser.add_argument("--transfers", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tls = make_pki(Path(tmp))
        print("| RPC (TCP) | Echo lock-step | connect + handshake p50 |")
        print("|---|---|---|")
        for case in (None, tls, None, tls):
            print(rpc_row(case, args.rounds, args.calls, args.connects), flush=True)
        print()
        print("| transfer (TCP) | data-key proof | 16 MiB write | 16 MiB read | 4 KiB read p50 |")
        print("|---|---|---|---|---|")
        for case, proof in ((None, False), (None, True), (tls, True)) * 2:
            print(transfer_row(case, proof, args.transfers), flush=True)


if __name__ == "__main__":
    main()

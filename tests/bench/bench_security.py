"""What TLS and token checks cost on the produce path: `danube bench produce` (1 KiB, fsync
before ack) against one ingest + one discovery, plain and secured (HTTPS with a local CA,
security.enabled with a bearer token: every request authenticated and authorized), in one
run, alternating, three rounds each; medians and the secured/plain ratio, batched (1000 per
request, 4 in flight) and single (one message per request, one in flight)."""

from __future__ import annotations

import asyncio
import ssl
import statistics
import tempfile
from pathlib import Path

from danube.security import ensure_signing_key, issue_token
from danube.security.pki import ensure_local_pki

from mesh import bench_mesh, bench_produce

ROUNDS = 3
# Counts, not durations: a flat-out run for a duration queues what it cannot send (its
# latency would be the queue's) and then drains it.
SHAPES = {
    "batched": ["--batch-size", "1000", "--inflight", "4", "-n", "50000"],
    "single": ["--batch-size", "1", "--linger-ms", "0", "--inflight", "1", "-n", "500"],
}


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        pki = ensure_local_pki(tmp / "pki")
        key = ensure_signing_key(tmp / "keys")
        token = issue_token(key, "bench", 3600, issuer="danube", audience="danube")
        secured_env = {
            "DANUBE_DISCOVERY__TLS__CERT_FILE": str(pki.server.cert),
            "DANUBE_DISCOVERY__TLS__KEY_FILE": str(pki.server.key),
            "DANUBE_SECURITY__ENABLED": "true",
            "DANUBE_SECURITY__KEYS_DIR": str(tmp / "keys"),
            "DANUBE_SECURITY__SUPER_ADMINS": '["bench"]',
        }
        context = ssl.create_default_context(cafile=pki.ca.cert)
        services = ["ingest", "discovery"]
        rates: dict[tuple[str, str], list[float]] = {}
        p50: dict[tuple[str, str], list[float]] = {}
        async with (
            bench_mesh(tmp / "plain", services) as plain,
            bench_mesh(
                tmp / "secured",
                services,
                secured_env,
                tls=context,
                headers={"authorization": f"Bearer {token}"},
            ) as secured,
        ):
            meshes = {
                "plain": (str(plain.base_url).rstrip("/"), []),
                "secured": (
                    str(secured.base_url).rstrip("/"),
                    ["--ca-file", str(pki.ca.cert), "--token", token],
                ),
            }
            for _ in range(ROUNDS):
                for shape, args in SHAPES.items():
                    for name, (url, cli) in meshes.items():
                        result = await bench_produce(url, args, cli=cli)
                        rates.setdefault((name, shape), []).append(float(result["msgs_per_s"]))  # type: ignore[arg-type]
                        latency = result.get("latency_ms") or {}
                        p50.setdefault((name, shape), []).append(float(latency["p50"]))  # type: ignore[index]
    for shape in SHAPES:
        plain_rate = statistics.median(rates[("plain", shape)])
        secured_rate = statistics.median(rates[("secured", shape)])
        plain_p50 = statistics.median(p50[("plain", shape)])
        secured_p50 = statistics.median(p50[("secured", shape)])
        print(
            f"{shape}: plain {plain_rate:.0f} msg/s (p50 {plain_p50:.2f} ms), "
            f"TLS+token {secured_rate:.0f} msg/s (p50 {secured_p50:.2f} ms), "
            f"ratio {secured_rate / plain_rate:.2f} (medians of {ROUNDS})"
        )


if __name__ == "__main__":
    asyncio.run(main())

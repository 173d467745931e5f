#!/usr/bin/env python3
"""Scrapes kilnd's metrics endpoint and checks it with prometheus_client's own parser.

  scrape_metrics.py unix:/path/to/kilnd-cpu.metrics [--times N] [--json]

Sends N HTTP/1.1 GET /metrics requests (default 1); every answer must be 200, parse whole with
prometheus_client.parser.text_string_to_metric_families, have HELP and TYPE for every family,
histogram buckets that never decrease and end at +Inf equal to _count, and no negative value.
Prints the last scrape's samples as JSON ({"name{labels}": value}) with --json.
Exit status 0 when every scrape passed, 1 otherwise (the reason on stderr).
"""
import argparse
import json
import socket
import sys

from prometheus_client.parser import text_string_to_metric_families


def get(address: str) -> str:
    if address.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address[5:])
    else:
        host, _, port = address[4:].rpartition(":")
        s = socket.create_connection((host.strip("[]"), int(port)))
    s.settimeout(10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: kilnd\r\nUser-Agent: scrape_metrics.py\r\n\r\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    if not lines[0].startswith("HTTP/1.1 200"):
        raise ValueError(f"status line {lines[0]!r}")
    headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    if int(headers.get("content-length", -1)) != len(body):
        raise ValueError(f"content-length {headers.get('content-length')} but {len(body)} bytes")
    if not headers.get("content-type", "").startswith("text/plain; version=0.0.4"):
        raise ValueError(f"content-type {headers.get('content-type')!r}")
    return body.decode()


def check(text: str) -> dict:
    samples = {}
    families = list(text_string_to_metric_families(text))
    if not families:
        raise ValueError("no metric family")
    for fam in families:
        if not fam.documentation:
            raise ValueError(f"{fam.name}: no HELP")
        if fam.type == "histogram":
            by_labels = {}
            for s in fam.samples:
                if s.name.endswith("_bucket"):
                    key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                    by_labels.setdefault(key, []).append((float(s.labels["le"]), s.value))
            for key, buckets in by_labels.items():
                values = [v for _, v in sorted(buckets)]
                if values != sorted(values):
                    raise ValueError(f"{fam.name}{dict(key)}: buckets decrease: {values}")
                count = [s.value for s in fam.samples if s.name == fam.name + "_count" and
                         tuple(sorted(s.labels.items())) == key]
                if sorted(buckets)[-1][0] != float("inf") or count != [values[-1]]:
                    raise ValueError(f"{fam.name}{dict(key)}: +Inf bucket {values[-1]} vs count {count}")
        for s in fam.samples:
            if s.value < 0:
                raise ValueError(f"{s.name}{s.labels}: negative value {s.value}")
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("--times", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    samples = {}
    for i in range(args.times):
        try:
            samples = check(get(args.address))
        except Exception as e:  # one line for the script that runs this
            print(f"scrape_metrics: scrape {i + 1}: {e}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(samples, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

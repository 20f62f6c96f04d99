#!/usr/bin/env python3
"""How many rows one `[nats] max_bytes` holds while ClickHouse is down (issue 40).

For each storage variant (messages plain or zstd, the stream S2-compressed by the server
or not) it starts a nats-server and `sluice run` with `max_bytes` and no reachable
ClickHouse (the ingest API takes rows it cannot check: they wait in the queue), then
POSTs web-log NDJSON rows (~190 bytes each) in 1,000-row requests until the API answers
503, and prints the rows accepted, the NDJSON bytes per byte of budget, and Sluice's
CPU (utime+stime from /proc) per accepted row. Nothing leaves loopback; every loop is
bounded. Run through scripts/bench-backlog (which builds the binary it runs).

    bench/backlog/backlog.py --sluice target/release/sluice --max-bytes 32MiB
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")
METHODS = ["GET", "GET", "GET", "POST", "GET", "PUT", "GET", "DELETE"]
PATHS = ["/", "/api/v1/items", "/api/v1/items/{}", "/static/app.{}.js",
         "/search?q=item{}", "/cart", "/checkout/{}", "/login"]
AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15",
    "curl/8.5.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:127.0) Gecko/20100101 Firefox/127.0",
]


def row(i):
    """One web-log line as JSON, about 190 bytes; fields vary as a real log's do."""
    h = (i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    return json.dumps({
        "ts": f"2026-11-30T{(h >> 8) % 24:02}:{(h >> 16) % 60:02}:{(h >> 24) % 60:02}.{h % 1000:03}Z",
        "ip": f"10.{(h >> 32) % 256}.{(h >> 40) % 256}.{(h >> 48) % 256}",
        "method": METHODS[h % len(METHODS)],
        "path": PATHS[(h >> 4) % len(PATHS)].format((h >> 12) % 100000),
        "status": [200, 200, 200, 304, 404, 500][(h >> 20) % 6],
        "bytes": (h >> 28) % 50000,
        "ms": (h >> 36) % 2000,
        "ua": AGENTS[(h >> 44) % len(AGENTS)],
    }, separators=(",", ":"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def post(url, body):
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "X-Tenant": "acme", "Content-Type": "application/x-ndjson"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_until(what, deadline_s, check):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def run(variant, args):
    work = tempfile.mkdtemp(prefix="sluice-backlog-")
    nats_port, api_port, admin_port, ch_port = free_port(), free_port(), free_port(), free_port()
    nats = subprocess.Popen(
        [variant["nats"], "-js", "-sd", f"{work}/js", "-a", "127.0.0.1", "-p", str(nats_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = f"""
[nats]
url = "nats://127.0.0.1:{nats_port}"
max_bytes = "{args.max_bytes}"
stream_compression = "{variant['stream']}"
[clickhouse.targets.main]
url = "http://127.0.0.1:{ch_port}"
user = "default"
database = "default"
[tenants.acme]
target = "main"
[api]
listen = "127.0.0.1:{api_port}"
auth = "none"
compression = "{variant['messages']}"
compression_level = {args.level}
compress_above = "{variant.get('above', args.compress_above)}"
[admin]
listen = "127.0.0.1:{admin_port}"
"""
    with open(f"{work}/sluice.toml", "w") as f:
        f.write(config)
    log = open(f"{work}/sluice.log", "w")
    wrap = []
    if args.callgrind:
        wrap = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/callgrind.out"]
    sluice = subprocess.Popen(wrap + [args.sluice, "run", "--config", f"{work}/sluice.toml"],
                              stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{api_port}/v1/ingest/events"
    try:
        wait_until("the ingest API", 600 if args.callgrind else 60,
                   lambda: post(url, row(0).encode())[0] == 202)
        accepted, ndjson_bytes, next_id, requests = 1, len(row(0)), 1, 0
        cpu_before = cpu_seconds(sluice.pid)
        while requests < args.max_requests:
            lines = [row(i) for i in range(next_id, next_id + args.request_rows)]
            body = ("\n".join(lines) + "\n").encode()
            status, reply = post(url, body)
            requests += 1
            took = reply.get("accepted", 0)
            accepted += took
            ndjson_bytes += sum(len(l) + 1 for l in lines[:took])
            next_id += args.request_rows
            if status == 503:
                break
            if status != 202:
                raise SystemExit(f"{variant['name']}: the API answered {status}: {reply}")
        cpu = cpu_seconds(sluice.pid) - cpu_before
    finally:
        sluice.terminate()
        try:
            sluice.wait(timeout=120)
        except subprocess.TimeoutExpired:
            sluice.kill()
        instructions = callgrind_total(f"{work}/callgrind.out") if args.callgrind else None
        nats.terminate()
        nats.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    budget = parse_size(args.max_bytes)
    return {
        "variant": variant["name"],
        "rows": accepted,
        "ndjson_per_budget_byte": round(ndjson_bytes / budget, 2),
        "row_bytes": round(ndjson_bytes / accepted, 1),
        "sluice_cpu_us_per_row": round(cpu * 1e6 / accepted, 2),
        "requests": requests,
        "instructions": instructions,
    }


def callgrind_total(path):
    """The instructions callgrind counted over the whole run (all threads)."""
    total = 0
    for name in os.listdir(os.path.dirname(path)):
        if name.startswith(os.path.basename(path)):
            with open(os.path.join(os.path.dirname(path), name)) as f:
                for line in f:
                    if line.startswith("totals:") or line.startswith("summary:"):
                        total += int(line.split()[1])
                        break
    return total


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sluice", required=True)
    p.add_argument("--nats-old", default="/usr/sbin/nats-server",
                   help="a nats-server without stream compression (Debian's 2.9.10)")
    p.add_argument("--nats-current", required=True,
                   help="a nats-server 2.10+ (for S2)")
    p.add_argument("--max-bytes", default="32MiB")
    p.add_argument("--level", type=int, default=1, help="[api] compression_level")
    p.add_argument("--compress-above", default="5%",
                   help="[api] compress_above of the zstd variants but zstd-always (0%%)")
    p.add_argument("--request-rows", type=int, default=1000)
    p.add_argument("--max-requests", type=int, default=5000)
    p.add_argument("--variants", default="off,zstd,s2,both")
    p.add_argument("--callgrind", action="store_true",
                   help="run Sluice under callgrind and report its instructions (use a small "
                        "--max-requests twice: the difference over the rows is per row)")
    args = p.parse_args()
    variants = {
        "off": {"messages": "none", "stream": "none", "nats": args.nats_old},
        "zstd": {"messages": "zstd", "stream": "none", "nats": args.nats_old},
        "zstd-always": {"messages": "zstd", "stream": "none", "nats": args.nats_old,
                        "above": "0%"},
        "off-2.10+": {"messages": "none", "stream": "none", "nats": args.nats_current},
        "s2": {"messages": "none", "stream": "s2", "nats": args.nats_current},
        "both": {"messages": "zstd", "stream": "s2", "nats": args.nats_current},
    }
    results = []
    for name in args.variants.split(","):
        v = dict(variants[name], name=name)
        r = run(v, args)
        print(json.dumps(r), flush=True)
        results.append(r)
    base = next((r for r in results if r["variant"] == "off"), None)
    print(f"\n{'variant':<10} {'rows':>9} {'x off':>6} {'NDJSON/budget':>14} {'CPU us/row':>11}")
    for r in results:
        ratio = f"{r['rows'] / base['rows']:.2f}" if base else "-"
        print(f"{r['variant']:<10} {r['rows']:>9} {ratio:>6} {r['ndjson_per_budget_byte']:>14} {r['sluice_cpu_us_per_row']:>11}")


if __name__ == "__main__":
    sys.exit(main())

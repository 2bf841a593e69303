"""A model server stand-in for the real-node tier (stdlib only).

Listens on $PORT (default 8000). It "loads the model" for --load-seconds (default 3) first:
until then every path answers 503, so a readiness probe fails; then 200.
Camp passes the service's args; CAMP_MODEL names the model source.
"""
import argparse
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READY = threading.Event()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        # every path answers 503 until the model is loaded (whatever health path the service names)
        code = 200 if READY.is_set() else 503
        self._send(code, {"model": os.environ.get("CAMP_MODEL", ""), "ready": READY.is_set()})

    do_POST = do_GET

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--load-seconds", type=float, default=3.0)
    a, _ = p.parse_known_args()
    port = int(os.environ.get("PORT", "8000"))
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    print(f"listening on {port}; loading model for {a.load_seconds}s", flush=True)

    def load() -> None:
        time.sleep(a.load_seconds)
        READY.set()
        print("model loaded", flush=True)

    threading.Thread(target=load, daemon=True).start()
    # PID 1 of its container ignores SIGTERM without a handler (a removed replica sat out its
    # 30-s grace): exit at once; requests in flight are the client's to retry.
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))
    server.serve_forever()


if __name__ == "__main__":
    main()

"""The rollout side's logs hold no session key: a real process configured as `slimeish train`
configures its logging logs an httpx error for a session URL, then dies of it."""

from __future__ import annotations

import subprocess
import sys

KEY = "sk-slimeish-" + "k3y" * 12

# A real loopback server that answers 503, and a request to a session path on it, as a token-in
# turn sends: httpx's error quotes the URL. Logged by a library logger, then raised uncaught.
PROCESS = f"""
import http.server, logging, threading, httpx
from slimeish.common.redact import mask_process_logs

class Busy(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(503); self.end_headers()
    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", 0), Busy)
threading.Thread(target=server.serve_forever, daemon=True).start()
logging.basicConfig(level=logging.INFO)
mask_process_logs()
url = f"http://127.0.0.1:{{server.server_port}}/s/{KEY}/generate"
try:
    httpx.post(url, json={{}}, headers={{"Authorization": "Bearer {KEY}"}}).raise_for_status()
except httpx.HTTPStatusError:
    logging.getLogger("slimeish.rollout_functions.token_in").exception("the turn failed")
    logging.getLogger("slimeish").warning("retrying %r", url)
httpx.post(url, json={{}}).raise_for_status()
"""


def test_session_keys_in_httpx_errors_are_masked_in_logs_and_the_last_traceback():
    done = subprocess.run([sys.executable, "-c", PROCESS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    log = done.stderr
    assert "HTTPStatusError" in log and "/s/<redacted>/generate" in log, log  # the errors are there...
    assert "httpx.HTTPStatusError: Server error '503 Service Unavailable' for url 'http://127.0.0.1:" in log, log
    assert KEY not in log and KEY.removeprefix("sk-slimeish-") not in log, log  # ...without the key

"""Serve the checked wheel files read-only to a build, over HTTP on the engine's bridge.

The build's ``pip install --no-index --find-links http://rlk-wheelhouse/ --require-hashes``
reads the index page (links to exactly the lock's files) and downloads what it installs; nothing
else on the host is reachable through it. The server is the build's ``http_proxy``: a build arg
the engine predefines, which (undeclared in the Dockerfile) is left out of every step's cache key
and of the image's history, so the address and a port chosen freely per build change nothing the
cache or the image records. ``rlk-wheelhouse`` needs no name resolution: the proxy answers for it.
Example::

    with serve_wheels(files, host="172.17.0.1", progress=print) as proxy:
        client.api.build(..., buildargs={**plan.build_args, "http_proxy": proxy})
"""

from __future__ import annotations

import html
import ipaddress
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from kit.model.errors import CheckFailed

WHEELHOUSE_HOST = "rlk-wheelhouse"
_CHUNK = 1 << 20


def bridge_gateway(client) -> str:
    """The host's address on the engine's default bridge (where a build step's network reaches it)."""
    try:
        config = client.networks.get("bridge").attrs["IPAM"]["Config"]
        gateway = next((c["Gateway"] for c in config if c.get("Gateway")), None)
        if gateway is None:
            # Some engines list only the subnet; the default bridge's gateway is then its first
            # address (docker0's own, 172.17.0.1 for 172.17.0.0/16).
            gateway = next(str(next(ipaddress.ip_network(c["Subnet"], strict=False).hosts()))
                           for c in config if c.get("Subnet") and ":" not in c["Subnet"])
        return gateway
    except Exception:   # no bridge network, or one without a gateway: say what the build needs
        raise CheckFailed("the engine's default bridge network has no gateway address; the CUDA build serves its "
                          "wheelhouse there (docker network inspect bridge)") from None


def index_page(names: list[str]) -> bytes:
    links = "".join(f'<a href="{quote(n)}">{html.escape(n)}</a>\n' for n in sorted(names))
    return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()


@contextmanager
def serve_wheels(files: dict[str, Path], *, host: str, port: int = 0, progress=None, served: dict | None = None):
    """Serve ``files`` (name -> path) at ``http://host:port/`` (port 0: any free one) while the block
    runs; yields that URL, the build's ``http_proxy``. ``served`` gets ``count`` and ``bytes``."""
    page = index_page(list(files))
    served = served if served is not None else {}
    served.update(count=0, bytes=0)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):   # noqa: N802 (http.server's name)
            # As a proxy the request line holds the whole URL (http://rlk-wheelhouse/NAME).
            name = unquote(urlparse(self.path).path.lstrip("/"))
            if name in ("", "index.html"):
                return self._send(page, "text/html")
            path = files.get(name)
            if path is None:
                self.send_error(404, "not a locked file")
                return
            size = path.stat().st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(_CHUNK), b""):
                    self.wfile.write(chunk)
            with lock:
                served["count"] += 1
                served["bytes"] += size
                if progress:
                    progress(f"wheel {served['count']}/{len(files)} {name[:60]} ({size / 1e6:.1f} MB, "
                             f"{served['bytes'] / 1e9:.2f} GB served)")

        def _send(self, body: bytes, kind: str):
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):   # progress goes through ``progress``, not stderr noise
            pass

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise CheckFailed(f"cannot serve the wheelhouse on {host}:{port} ({exc.strerror}); the build reaches the "
                          "host at the engine's bridge gateway") from None
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="kit-wheelhouse", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

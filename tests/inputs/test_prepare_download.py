"""Resumable download against a real HTTP server on localhost: Range resume, checksums, truncation."""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from kit.cli import cli
from kit.model.documents import schema_problems
from kit.inputs.download import download, partial_path
from kit.model.errors import BadInput
from kit.inputs.prepare import Workspace, prepare_dataset
from fixtures_prepare import EXPECTED_JSONL, write_parquet


class Server:
    """Serves one payload at /file; behaviour switches let a test truncate, lie or ignore Range."""

    def __init__(self, payload: bytes):
        self.payload = payload
        self.truncate_next: int | None = None   # send only this many bytes of the next response, then close
        self.stated_sha256: str | None = hashlib.sha256(payload).hexdigest()
        self.honour_range = True
        self.ranges: list[str | None] = []
        # as the Hugging Face hub: /resolve/... answers 302 with the sha256 as X-Linked-ETag, and the CDN
        # it points to (/cdn/...) serves the bytes with an ETag that is no sha256
        self.redirect_sha256: str | None = hashlib.sha256(payload).hexdigest()
        self.redirects = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if not self.path.endswith(".parquet"):
                    self.send_error(404)
                    return
                if self.path.startswith("/resolve/"):
                    outer.redirects += 1
                    self.send_response(302)
                    self.send_header("Location", "/cdn/" + self.path.rsplit("/", 1)[1])
                    if outer.redirect_sha256:
                        self.send_header("X-Linked-ETag", f'"{outer.redirect_sha256}"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                cdn = self.path.startswith("/cdn/")
                rng = self.headers.get("Range")
                outer.ranges.append(rng)
                body, status, extra = outer.payload, 200, {}
                if rng and outer.honour_range:
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(outer.payload):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(outer.payload)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    body, status = outer.payload[start:], 206
                    extra["Content-Range"] = f"bytes {start}-{len(outer.payload) - 1}/{len(outer.payload)}"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                if cdn:
                    self.send_header("ETag", '"9b2cf535f27731c974343645a3985328-3"')   # a multipart S3 ETag
                elif outer.stated_sha256:
                    self.send_header("X-Linked-ETag", f'"{outer.stated_sha256}"')
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                if outer.truncate_next is not None:
                    body, outer.truncate_next = body[: outer.truncate_next], None
                    self.wfile.write(body)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/data/train-00000-of-00001.parquet"

    @property
    def redirecting_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/resolve/main/train-00000-of-00001.parquet"


@pytest.fixture
def server():
    srv = Server(os.urandom(3 * (1 << 20) + 123))
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def test_full_download_verified_by_server_checksum(tmp_path, server):
    bar = io.StringIO()
    got = download(server.url, tmp_path / "f.parquet", progress=bar)
    assert got.path.read_bytes() == server.payload
    assert got.sha256 == hashlib.sha256(server.payload).hexdigest()
    assert got.checksum_source == "server" and got.resumed_from == 0
    assert not partial_path(got.path).exists()
    assert "100.0%" in bar.getvalue() and "MiB" in bar.getvalue()
    assert server.ranges == [None]


def test_resume_after_truncation(tmp_path, server):
    dest = tmp_path / "f.parquet"
    server.truncate_next = 1_000_000
    with pytest.raises(BadInput, match="run the command again to resume"):
        download(server.url, dest)
    assert not dest.exists()
    assert partial_path(dest).stat().st_size == 1_000_000
    got = download(server.url, dest)
    assert server.ranges[-1] == "bytes=1000000-"
    assert got.resumed_from == 1_000_000
    assert dest.read_bytes() == server.payload


def test_resume_when_partial_is_already_complete(tmp_path, server):
    dest = tmp_path / "f.parquet"
    partial_path(dest).write_bytes(server.payload)
    got = download(server.url, dest, expected_sha256=hashlib.sha256(server.payload).hexdigest())
    assert server.ranges == [f"bytes={len(server.payload)}-"]
    assert got.checksum_source == "caller" and dest.read_bytes() == server.payload


def test_server_ignoring_range_restarts(tmp_path, server):
    dest = tmp_path / "f.parquet"
    partial_path(dest).write_bytes(server.payload[:5000])
    server.honour_range = False
    got = download(server.url, dest)
    assert got.resumed_from == 0 and dest.read_bytes() == server.payload


def test_checksum_mismatch_removes_download(tmp_path, server):
    dest = tmp_path / "f.parquet"
    server.stated_sha256 = "0" * 64
    with pytest.raises(BadInput, match="checksum mismatch.*stated by the server"):
        download(server.url, dest)
    assert not dest.exists() and not partial_path(dest).exists()
    server.stated_sha256 = None
    with pytest.raises(BadInput, match="checksum mismatch.*given"):
        download(server.url, dest, expected_sha256="1" * 64)
    assert not dest.exists() and not partial_path(dest).exists()


def test_unreachable_and_missing(tmp_path, server):
    with pytest.raises(BadInput, match="HTTP 404"):
        download(server.url + ".missing", tmp_path / "a")
    assert not (tmp_path / "a").exists()
    port = server.httpd.server_address[1]
    server.httpd.shutdown()
    server.httpd.server_close()
    with pytest.raises(BadInput, match="cannot download"):
        download(f"http://127.0.0.1:{port}/x", tmp_path / "b", timeout=5)


@pytest.fixture
def parquet_server(tmp_path):
    srv = Server(write_parquet(tmp_path / "src.parquet").read_bytes())
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def test_prepare_from_url_truncated_then_resumed(tmp_path, parquet_server):
    ws = tmp_path / "ws"
    parquet_server.truncate_next = 100
    result = CliRunner().invoke(cli, ["prepare", "--workspace", str(ws), "--dataset-source", parquet_server.url,
                                      "--accept-new-hash"])
    assert result.exit_code == 2, result.output
    assert "download interrupted" in result.output or "truncated" in result.output
    assert f"\nkit: --dataset-source {parquet_server.url}: " in result.stderr
    assert not Workspace(ws).data.exists()
    result = CliRunner().invoke(cli, ["prepare", "--workspace", str(ws), "--dataset-source", parquet_server.url,
                                      "--accept-new-hash", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["dataset"]["document"]
    assert doc["source"] == parquet_server.url and doc["source_checksum"] == "server"
    assert doc["source_sha256"] == hashlib.sha256(parquet_server.payload).hexdigest()
    assert Workspace(ws).data.read_bytes() == EXPECTED_JSONL.encode()
    assert parquet_server.ranges[-1] == "bytes=100-"
    # a second run reuses the verified download and the data: no further request
    n = len(parquet_server.ranges)
    assert prepare_dataset(ws, source=parquet_server.url).reused
    assert len(parquet_server.ranges) == n


def test_unreachable_source_names_the_flag(tmp_path, server):
    port = server.httpd.server_address[1]
    server.httpd.shutdown()
    server.httpd.server_close()
    url = f"http://127.0.0.1:{port}/train.parquet"
    result = CliRunner().invoke(cli, ["prepare", "--workspace", str(tmp_path / "ws"), "--dataset-source", url])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"kit: --dataset-source {url}: cannot download") and "Traceback" not in result.output
    assert not Workspace(tmp_path / "ws").data.exists()


# --- the checksum on a redirect, and what a reused download was checked against ---------------------

def test_checksum_stated_on_the_redirect_is_verified(tmp_path, server):
    from kit.inputs.download import read_record, record_path

    got = download(server.redirecting_url, tmp_path / "f.parquet")
    assert server.redirects == 1 and got.path.read_bytes() == server.payload
    assert got.checksum_source == "server" and got.expected_sha256 == hashlib.sha256(server.payload).hexdigest()
    record = read_record(got.path)
    assert schema_problems(json.loads(record_path(got.path).read_text()), "download-record") == []
    assert (record["checksum_source"], record["sha256"], record["size"]) == ("server", got.sha256, len(server.payload))

    # a wrong sha256 on the redirect is caught, and the bytes removed
    server.redirect_sha256 = "0" * 64
    with pytest.raises(BadInput, match="checksum mismatch.*stated by the server"):
        download(server.redirecting_url, tmp_path / "g.parquet")
    assert not (tmp_path / "g.parquet").exists() and not partial_path(tmp_path / "g.parquet").exists()

    # no sha256 on the redirect and none from the CDN (its ETag is no sha256): size-checked only, and said so
    server.redirect_sha256 = None
    got = download(server.redirecting_url, tmp_path / "h.parquet")
    assert got.checksum_source is None and read_record(got.path)["checksum_source"] is None


def test_resume_through_the_redirect_keeps_range_and_checksum(tmp_path, server):
    dest = tmp_path / "f.parquet"
    server.truncate_next = 500_000
    with pytest.raises(BadInput, match="run the command again to resume"):
        download(server.redirecting_url, dest)
    got = download(server.redirecting_url, dest)
    assert server.ranges[-1] == "bytes=500000-" and got.resumed_from == 500_000
    assert got.checksum_source == "server" and dest.read_bytes() == server.payload


def _prepare_json(ws, url):
    result = CliRunner().invoke(cli, ["prepare", "--workspace", str(ws), "--dataset-source", url,
                                      "--accept-new-hash", "--json"])
    return result, (json.loads(result.stdout)["dataset"]["document"] if result.exit_code == 0 else None)


def _forget_dataset(ws):
    Workspace(ws).data.unlink()
    Workspace(ws).data_provenance.unlink()


def test_a_reused_download_records_the_check_it_had(tmp_path, parquet_server):
    from kit.inputs.download import record_path

    ws = tmp_path / "ws"
    parquet_server.stated_sha256 = None          # this server states no checksum: size-checked only
    _, doc = _prepare_json(ws, parquet_server.url)
    assert doc["source_checksum"] is None
    _forget_dataset(ws)
    n = len(parquet_server.ranges)
    _, doc = _prepare_json(ws, parquet_server.url)
    assert len(parquet_server.ranges) == n       # the download was reused, not fetched again
    assert doc["source_checksum"] is None        # ... and not claimed as verified

    # from the redirecting URL the hub's sha256 was checked; the reuse says so
    ws2 = tmp_path / "ws2"
    _, doc = _prepare_json(ws2, parquet_server.redirecting_url)
    assert doc["source_checksum"] == "server"
    _forget_dataset(ws2)
    _, doc = _prepare_json(ws2, parquet_server.redirecting_url)
    assert doc["source_checksum"] == "server" and parquet_server.redirects == 1

    # a download changed since its record is refused; one without a record is reused as unchecked
    download_file = Workspace(ws2).download_path(parquet_server.redirecting_url)
    _forget_dataset(ws2)
    download_file.write_bytes(download_file.read_bytes() + b"\0")
    result, _ = _prepare_json(ws2, parquet_server.redirecting_url)
    assert result.exit_code == 1 and "recorded" in result.stderr and str(download_file) in result.stderr
    assert not Workspace(ws2).data.exists()
    download_file.write_bytes(parquet_server.payload)
    record_path(download_file).unlink()
    _, doc = _prepare_json(ws2, parquet_server.redirecting_url)
    assert doc["source_checksum"] is None

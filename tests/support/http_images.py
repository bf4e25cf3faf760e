"""Colour squares served over HTTP on 127.0.0.1, and a triplet file whose images are their URLs.

:func:`serve_colour_squares` writes one PNG per colour of :data:`COLOURS` to a folder and serves
it with the standard library's threading HTTP server (every path requested is recorded);
:func:`http_triplets` writes ``n`` training triplets over those URLs.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import io
import threading
from pathlib import Path
from typing import Iterator

from PIL import Image

from hardpos.data.triplets import write_triplets
from tests.support.fixtures import free_port

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}


@contextlib.contextmanager
def serve_colour_squares(folder: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve the colour squares from ``folder`` (created); yields (base URL, paths requested)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rgb in COLOURS.items():
        img = Image.new("RGB", (40, 40), (250, 250, 250))
        img.paste(rgb, (8, 8, 32, 32))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        (folder / f"{name}.png").write_bytes(buf.getvalue())
    seen: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            seen.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), functools.partial(Handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def http_triplets(base: str, path: Path, n: int = 24) -> str:
    """``n`` triplets over the served squares (``a red square`` / its next colour / a paraphrase)."""
    names = list(COLOURS)
    rows = [{"image": f"{base}/{names[i % 4]}.png", "caption": f"a {names[i % 4]} square",
             "hard_negative": f"a {names[(i + 1) % 4]} square", "hard_positive": f"a square that is {names[i % 4]}",
             "kind": "replace", "source": "test", "caption_id": str(i)} for i in range(n)]
    return write_triplets(rows, str(path))

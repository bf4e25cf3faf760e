"""Images named by http:// URLs on a real server (127.0.0.1): the package has one image resolver
(URIs with a scheme are left as they are) and one loader (local, s3://, http(s)://) for
training, evaluation and retention alike. A triplet file of such images trains on Ray Train
workers and evaluates in ``tests/test_models_uri.py`` (one Ray Train run that also starts from
a registered model)."""
from __future__ import annotations

import pytest

from hardpos.data.images import load_image
from hardpos.data.triplets import resolve_image
from tests.support.http_images import COLOURS, serve_colour_squares


@pytest.fixture
def image_server(tmp_path):
    """The colour squares served over HTTP; yields (base URL, paths requested)."""
    with serve_colour_squares(tmp_path / "served") as served:
        yield served


def test_uris_with_a_scheme_are_left_alone_and_load(image_server, tmp_path):
    base, seen = image_server
    assert resolve_image(f"{base}/red.png", "/some/folder") == f"{base}/red.png"
    assert resolve_image("red.png", "/x", image_root=f"{base}/") == f"{base}/red.png"
    assert resolve_image("../red.png", f"{base}/sub") == f"{base}/red.png"
    img = load_image(f"{base}/red.png", crop=(8, 8, 10, 10))
    assert img.size == (10, 10) and img.getpixel((2, 2)) == COLOURS["red"]
    with pytest.raises(FileNotFoundError, match="404"):
        load_image(f"{base}/absent.png")
    assert seen == ["/red.png", "/absent.png"]

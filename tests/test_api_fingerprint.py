"""scripts/api_fingerprint.py: what it normalises, and that its command line parses (a whole run needs a
database of its own to drop and re-create: ``python scripts/api_fingerprint.py --recreate``)."""

from __future__ import annotations

import pytest

from scripts.api_fingerprint import main, normalised, response_name


def test_only_the_volatile_bits_are_normalised():
    page = (b'<input type="hidden" name="csrfmiddlewaretoken" value="AbC123"><script nonce="x/Y=="></script>'
            b'{"database":{"ok":true,"ms":0.16}} request.headers["X-CSRFTOKEN"] = "q9";')
    assert normalised(page) == (b'<input type="hidden" name="csrfmiddlewaretoken" value="<csrf>">'
                                b'<script nonce="<nonce>"></script>{"database":{"ok":true,"ms":<ms>}} '
                                b'request.headers["X-CSRFTOKEN"] = "<csrf>";')
    body = b'{"count":2,"results":[{"total_ms":3.0,"z":4.2,"at":"2026-03-02T10:00:25.500000Z"}]}'
    assert normalised(body) == body


def test_response_names_are_file_names():
    assert response_name("GET", "/api/v1/nodes/?group=llama&limit=3") == "GET_api_v1_nodes_group=llama_limit=3"


def test_help_parses(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "--recreate" in capsys.readouterr().out

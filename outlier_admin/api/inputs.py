"""How the API reads what a client sends, where DRF's defaults answered some inputs with a 500.

- :class:`Pagination`: DRF's limit/offset pagination with a ceiling on ``limit``. Unbounded,
  ``?limit=99999999999999999999`` reached PostgreSQL as a ``LIMIT`` beyond bigint (a 500), and any
  ``limit`` under that made one request read a whole table. Over the ceiling the page is the ceiling
  (DRF's rule for ``max_limit``); ``next`` links to the rest.
- :data:`PARSERS`: JSON only (see there).
- :class:`JSONParser`: a JSON body nested deeper than Python's recursion limit (``{"reason":
  [[[[...]]]]}``) raised ``RecursionError`` out of DRF's parser, which only turns ``ValueError`` into
  a 400; it is a 400 ("JSON parse error") like any other unreadable body.
"""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.pagination import LimitOffsetPagination

#: The most rows one page of a list endpoint returns (the default page is ``PAGE_SIZE``, 100).
MAX_PAGE = 1000


class Pagination(LimitOffsetPagination):
    max_limit = MAX_PAGE


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: dict[str, Any] | None = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the document is nested too deeply") from None


#: JSON only. With DRF's defaults (JSON, form, multipart) every action offered three request bodies in
#: the OpenAPI schema, and a client generated from it (openapi-python-client) could not even import 9 of
#: its modules; a form or multipart body is now a 415 like any other content type we do not read.
PARSERS = [JSONParser]

"""HTTP responses: problem+json bodies, the claim outcome -> HTTP mapping, and what is stored for a replay.

Everything here is pure (no database, no WSGI), so it is unit tested on its own.
"""

import base64
import json
from dataclasses import dataclass, field
from http import HTTPStatus

PROBLEM_BASE = "https://idempotency.dev/problems/"

#: The largest request body the middleware reads (clients/CONTRACT.md "body-limit"): 1 MiB.  Over it: 413.
MAX_BODY_BYTES = 1024 * 1024

#: Internal header kept with a stored response whose body is not stored as JSON: "text" or "base64".
BODY_ENCODING_HEADER = "Idempotency-Body-Encoding"

#: Headers never stored for a replay: they describe one connection or one response, not the answer.
NOT_REPLAYED = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length", "Date", "Server", "Set-Cookie",
        "Upgrade", "TE", "Trailer", "Proxy-Authenticate", "Proxy-Connection", "Idempotent-Replayed",
        BODY_ENCODING_HEADER,
    )
)


@dataclass
class Response:
    status: int
    headers: list = field(default_factory=list)  # [(name, value)], as WSGI wants them
    body: bytes = b""

    def header(self, name):
        """The first value of header ``name`` (case-insensitive), or None."""
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def status_line(self):
        try:
            phrase = HTTPStatus(self.status).phrase
        except ValueError:
            phrase = "Unknown"
        return "%d %s" % (self.status, phrase)

    def wsgi_headers(self):
        """The headers with a Content-Length matching the body."""
        hs = [(k, v) for k, v in self.headers if k.lower() != "content-length"]
        hs.append(("Content-Length", str(len(self.body))))
        return hs


class HTTPProblem(Exception):
    """Raised (e.g. by a scope function) to answer a problem at once, before any claim."""

    def __init__(self, status, slug, title, detail="", headers=(), base=PROBLEM_BASE):
        super().__init__(detail or title)
        self.response = problem(status, slug, title, detail, headers, base)


class NotExecuted(Exception):
    """Raised by a handler that refused the request before doing anything (body validation): ``response`` is sent
    as is, and the transaction rolls back, so nothing is stored and the key is free for the corrected retry
    (clients/CONTRACT.md "not-executed").  Only a status below 500 makes sense (a 5xx is never stored anyway)."""

    def __init__(self, response):
        if not isinstance(response, Response):
            raise TypeError("NotExecuted needs an idempotency_pg.Response")
        super().__init__(response.status)
        self.response = response


class BodyTooLarge(Exception):
    """The request body is over the limit (its Content-Length, or the bytes read so far): answered 413."""


class BodyIncomplete(Exception):
    """The request body ended before its Content-Length (the client hung up): nothing is claimed or run."""


def body_too_large(limit, base=PROBLEM_BASE):
    return problem(413, "request-too-large", "Request body too large",
                   "the request body is over %d bytes" % limit, (), base)


@dataclass
class Problem:
    """An answer the middleware writes itself (CONTRACT.md "error-shape"), before it is given a shape: ``status``,
    ``type`` (the problem type's last segment: ``idempotency-key-missing``, ``idempotency-key-invalid``,
    ``idempotency-key-in-progress``, ``idempotency-key-expired``, ``request-too-large``, ``idempotency-key-reused``,
    ``internal-error``, ...), ``title``, ``detail`` and the ``headers`` the middleware adds (``Retry-After: 1`` on
    409).  The ``render_problem(problem) -> Response`` option writes it; the default is :func:`problem_json`."""

    status: int
    type: str
    title: str
    detail: str = ""
    headers: list = field(default_factory=list)


def problem_json(p, base=PROBLEM_BASE):
    """The default ``render_problem``: RFC 9457 ``application/problem+json``, ``type`` under ``base``."""
    return problem(p.status, p.type, p.title, p.detail, p.headers, base)


def renderer(render_problem=None, base=PROBLEM_BASE):
    """``render_problem``, or :func:`problem_json` under ``base``."""
    return render_problem if render_problem is not None else (lambda p: problem_json(p, base))


def problem(status, slug, title, detail="", headers=(), base=PROBLEM_BASE):
    """An RFC 9457 ``application/problem+json`` response."""
    body = {"type": base + slug, "title": title, "status": status, "detail": detail}
    return Response(
        status,
        [("Content-Type", "application/problem+json")] + list(headers),
        json.dumps(body, separators=(",", ":")).encode(),
    )


def json_response(status, obj, headers=()):
    return Response(
        status,
        [("Content-Type", "application/json")] + list(headers),
        json.dumps(obj, separators=(",", ":")).encode(),
    )


def claim_response(outcome, http_status, response_body, response_headers, base=PROBLEM_BASE, content_type=None,
                   render_problem=None):
    """Map one claim row to the answer, or None for ``claimed`` (run the handler).

    ``response_body``: the stored body (bytes, or a 1.0-1.2 jsonb column as text); ``response_headers``: the stored
    headers as JSON text, or None; ``content_type``: 1.3's stored content type, or None; ``render_problem``: writes
    a mismatch, in_progress or expired answer (:class:`Problem`; default :func:`problem_json` under ``base``).
    """
    render = renderer(render_problem, base)
    if outcome == "claimed":
        return None
    if outcome == "replay":
        return replay_response(http_status, response_body, response_headers, content_type)
    if outcome == "mismatch":
        return render(Problem(http_status or 422, "idempotency-key-reused", "Idempotency-Key reused",
                              "this Idempotency-Key was already used with a different request",
                              answer_headers(outcome, response_headers)))
    if outcome == "in_progress":
        return render(Problem(409, "idempotency-key-in-progress", "Request in progress",
                              "a request with this Idempotency-Key is still being processed; retry later",
                              [("Retry-After", "1")] + answer_headers(outcome, response_headers)))
    if outcome == "expired":  # 1.4, idempotency.tombstone_ttl: the stored response is gone for good
        return render(Problem(410, "idempotency-key-expired", "Idempotency-Key expired",
                              "the response stored for this Idempotency-Key has expired; send the request with a "
                              "new key"))
    raise ValueError("unknown claim outcome %r" % (outcome,))


#: The header that says until when the key is kept (CONTRACT.md "key-lifetime", 1.4), written by the server.
KEY_EXPIRES_HEADER = "Idempotency-Key-Expires"


def answer_headers(outcome, headers_text):
    """The headers a claim's answer carries besides a replay's stored ones (1.4, CONTRACT.md "key-lifetime"): on
    ``claimed``, ``mismatch`` and ``in_progress``, the members of the claim's headers object (the key's expiry,
    ``Idempotency-Key-Expires``), as ``[(name, value)]``; string values only, none that could split a header
    block; ``[]`` on a 1.3 server or when the server knows none.  A claimed key's go on its first answer once it is
    stored, never into the completion."""
    if outcome == "replay" or headers_text is None:
        return []
    try:
        obj = json.loads(headers_text) if isinstance(headers_text, (str, bytes)) else headers_text
    except ValueError:
        return []
    if not isinstance(obj, dict):
        return []
    return [(k, v) for k, v in obj.items()
            if isinstance(k, str) and isinstance(v, str) and not any(c in v for c in "\r\n\0")]


def with_headers(response, extra):
    """``response`` with ``extra`` headers added (a new :class:`Response`; the stored one is not changed)."""
    if not extra:
        return response
    return Response(response.status, list(response.headers) + list(extra), response.body)


def replay_response(http_status, body, headers_text, content_type=None):
    """The stored response plus ``Idempotent-Replayed: true``: 1.3 stores the bytes sent; a body stored by
    :func:`stored_form` (1.0-1.2 clients) that is not JSON comes back as a JSON string decoded here."""
    stored = json.loads(headers_text) if headers_text else {}
    encoding = None
    headers = [("Content-Type", content_type)] if content_type else []
    for k, v in stored.items():
        if k.lower() == BODY_ENCODING_HEADER.lower():
            encoding = v
        else:
            headers.append((k, str(v)))
    if isinstance(body, str):
        body = body.encode("utf-8")  # jsonb's canonical text of the stored JSON body
    if body is None:
        body = b""
    elif encoding is not None:
        value = json.loads(body)
        body = value.encode("utf-8") if encoding == "text" else base64.b64decode(value)
    headers.append(("Idempotent-Replayed", "true"))
    return Response(http_status, headers, body)


#: Stored headers saying what a route left out of the stored body (CONTRACT.md "store-less").
REDACTED_HEADER = "Idempotent-Replay-Redacted"
BODY_OMITTED_HEADER = "Idempotent-Replay-Body"


def _pointer_tokens(pointer):
    """An RFC 6901 JSON Pointer's reference tokens (``~1`` is ``/``, ``~0`` is ``~``)."""
    if not pointer.startswith("/"):
        raise ValueError("a JSON Pointer starts with /: %r" % (pointer,))
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _drop(value, tokens):
    """Remove the member (or array element) ``tokens`` points at from ``value``; whether it was there."""
    for i, token in enumerate(tokens):
        last = i == len(tokens) - 1
        if isinstance(value, dict):
            if token not in value:
                return False
            if last:
                del value[token]
                return True
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and (token == "0" or not token.startswith("0")):
            if int(token) >= len(value):
                return False
            if last:
                del value[int(token)]
                return True
            value = value[int(token)]
        else:
            return False
    return False


def stored_body(body, headers, redact=(), store_body=True):
    """``(body, headers)`` to store for a route's answer (CONTRACT.md "store-less"); ``headers``: the dict of
    :func:`replayed_headers` (changed in place).  ``store_body`` False: no body (None), and
    ``Idempotent-Replay-Body: omitted``.  ``redact``: JSON Pointers dropped from a JSON object body; when any was
    present, the rest is serialised again and ``Idempotent-Replay-Redacted`` lists the pointers dropped, in the
    order given.  A body that is not a JSON object is stored as is."""
    if not store_body:
        headers[BODY_OMITTED_HEADER] = "omitted"
        return None, headers
    if not redact or not body:
        return body, headers
    try:
        value = json.loads(body)
    except ValueError:
        return body, headers
    if not isinstance(value, dict):
        return body, headers
    dropped = [p for p in redact if _drop(value, _pointer_tokens(p))]
    if not dropped:
        return body, headers
    headers[REDACTED_HEADER] = ", ".join(dropped)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"), headers


def replayed_headers(response, replay_headers=None):
    """The headers of ``response`` to store for a replay, as a dict: ``replay_headers``, when given, is the
    allow-list (case-insensitive); otherwise every header but the per-connection ones in :data:`NOT_REPLAYED`.
    Repeated headers are joined with ", "."""
    allow = None if replay_headers is None else {h.lower() for h in replay_headers}
    headers, lower_to_name = {}, {}
    for k, v in response.headers:
        lk = k.lower()
        if lk in NOT_REPLAYED or (allow is not None and lk not in allow):
            continue
        if lk in lower_to_name:
            headers[lower_to_name[lk]] += ", " + v
        else:
            lower_to_name[lk] = k
            headers[k] = v
    return headers


def is_json_type(content_type):
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def stored_form(response, replay_headers=None):
    """What 1.0-1.2 clients stored for ``response`` with ``idem_complete`` or ``idem_lease_complete`` (1.3 stores
    the bytes sent: :func:`idempotency_pg.core.complete_args`), and :func:`replay_response` still replays: ``(body
    as JSON text or None, headers as JSON text)``.

    A JSON body (by its Content-Type) is stored as JSON; any other body as a JSON string, its encoding kept in an
    internal header that the replay removes.  ``replay_headers``, when given, is the allow-list of headers to store
    (case-insensitive); otherwise every header but the per-connection ones in :data:`NOT_REPLAYED`.  Repeated
    headers are joined with ", ".
    """
    headers = replayed_headers(response, replay_headers)
    body = response.body
    body_json = None
    if body:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and is_json_type(response.header("Content-Type")):
            try:
                json.loads(text, parse_constant=_refuse_constant)
                body_json = text
            except ValueError:
                pass
        if body_json is None:
            if text is not None:
                headers[BODY_ENCODING_HEADER] = "text"
                body_json = json.dumps(text)
            else:
                headers[BODY_ENCODING_HEADER] = "base64"
                body_json = json.dumps(base64.b64encode(body).decode("ascii"))
    return body_json, json.dumps(headers)


def _refuse_constant(name):
    raise ValueError("%s is not JSON" % name)


def parse_json_body(raw):
    """The request body as text if it is JSON (UTF-8, no NaN/Infinity), else raise ValueError."""
    text = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    json.loads(text, parse_constant=_refuse_constant)
    return text

"""Parsing of the ``Idempotency-Key`` request header.

The IETF draft (draft-ietf-httpapi-idempotency-key-header) makes the field a Structured Field Item whose value is a
String (RFC 8941 section 3.3.3): ``"abc"``, with ``\\"`` and ``\\\\`` the only escapes.  Many clients send the key
bare (``abc``, a UUID), so the bare form is accepted too and means the same key: ``"abc"`` and ``abc`` are one key.

Rules (clients/CONTRACT.md):

* the header absent -> :class:`MissingKey`;
* empty (``""`` or an empty value), not parsable, over 255 bytes, or with control characters -> :class:`InvalidKey`;
* several keys -> :class:`InvalidKey`: HTTP joins two header lines of one field with ``,`` (RFC 9110 5.3), so a
  ``,`` outside a quoted string (``k1,k2``, ``"k1", "k2"``), or a list of values (a server that keeps the lines
  apart), is several keys.  A ``,`` inside a quoted key (``"a,b"``) is part of it.

Leading and trailing spaces and tabs (HTTP's OWS) are not part of the value.  Anything after the closing quote of a
quoted key is refused (Structured Field parameters are not used by the draft).  A bare key is visible ASCII
(``%x21-7E``) without ``"``; a quoted key holds printable ASCII (``%x20-7E``) where ``"`` and ``\\`` must be escaped.
"""

MAX_KEY_BYTES = 255


class KeyHeaderError(ValueError):
    """Base class of the header errors; ``slug`` names the problem type."""

    slug = "idempotency-key-invalid"


class MissingKey(KeyHeaderError):
    slug = "idempotency-key-missing"


class InvalidKey(KeyHeaderError):
    slug = "idempotency-key-invalid"


def parse_idempotency_key(value):
    """Return the key from the raw field value (``str``, or ``None`` when the header is absent).

    Raises :class:`MissingKey` or :class:`InvalidKey`.
    """
    if value is None:
        raise MissingKey("the Idempotency-Key header is required")
    if isinstance(value, (list, tuple)):
        if len(value) > 1:
            raise InvalidKey("several Idempotency-Key headers: send one key")
        if not value:
            raise MissingKey("the Idempotency-Key header is required")
        value = value[0]
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    value = value.strip(" \t")
    if value == "":
        raise InvalidKey("the Idempotency-Key header is empty")
    if value[0] == '"':
        key = _parse_sf_string(value)
    else:
        key = _parse_bare(value)
    if key == "":
        raise InvalidKey("the Idempotency-Key header is empty")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise InvalidKey("the Idempotency-Key is over %d bytes" % MAX_KEY_BYTES)
    return key


def _parse_sf_string(value):
    out = []
    i, n = 1, len(value)
    while i < n:
        c = value[i]
        if c == "\\":
            if i + 1 >= n:
                raise InvalidKey("the Idempotency-Key ends inside an escape")
            nxt = value[i + 1]
            if nxt not in ('"', "\\"):
                raise InvalidKey("the Idempotency-Key has an invalid escape \\%s" % _show(nxt))
            out.append(nxt)
            i += 2
        elif c == '"':
            if i + 1 != n:
                if value[i + 1:].lstrip(" \t").startswith(","):
                    raise InvalidKey("several Idempotency-Key values (a comma outside the quotes): send one key")
                raise InvalidKey("the Idempotency-Key has characters after its closing quote")
            return "".join(out)
        elif _is_control(c):
            raise InvalidKey("the Idempotency-Key contains a control character")
        elif not (" " <= c <= "~"):
            raise InvalidKey("the Idempotency-Key contains a character outside printable ASCII")
        else:
            out.append(c)
            i += 1
    raise InvalidKey("the Idempotency-Key has no closing quote")


def _parse_bare(value):
    if "," in value:
        raise InvalidKey("several Idempotency-Key values (a comma outside quotes): send one key")
    for c in value:
        if _is_control(c):
            raise InvalidKey("the Idempotency-Key contains a control character")
        if c == '"':
            raise InvalidKey("the Idempotency-Key has a quote inside a bare key")
        if not ("!" <= c <= "~"):
            raise InvalidKey("a bare Idempotency-Key must be visible ASCII (quote a key with spaces)")
    return value


def _is_control(c):
    o = ord(c)
    return o < 0x20 or o == 0x7F or 0x80 <= o <= 0x9F


def _show(c):
    return c if " " <= c <= "~" else "\\x%02x" % ord(c)

import pytest

from idempotency_pg import InvalidKey, MissingKey, parse_idempotency_key as parse


@pytest.mark.parametrize("raw,key", [
    ('"abc"', "abc"),
    ("abc", "abc"),
    ('  "abc"\t', "abc"),
    ("  abc ", "abc"),
    (r'"a\"b"', 'a"b'),
    (r'"a\\b"', "a\\b"),
    (r'"\\\""', '\\"'),
    ('"with space"', "with space"),
    ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
    ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
    ("a;c=d", "a;c=d"),
    ('"a,b"', "a,b"),          # a comma inside a quoted key is part of it
    (["k1"], "k1"),            # one header line, as a list
    ('"' + "x" * 255 + '"', "x" * 255),
    ("x" * 255, "x" * 255),
    (b'"bytes"', "bytes"),
])
def test_valid(raw, key):
    assert parse(raw) == key


def test_quoted_and_bare_are_the_same_key():
    assert parse('"order-17"') == parse("order-17")


def test_missing():
    with pytest.raises(MissingKey) as e:
        parse(None)
    assert e.value.slug == "idempotency-key-missing"


@pytest.mark.parametrize("raw", [
    "", "   ", '""',
    '"abc', 'abc"', 'a"bc', '"abc"x', '"abc" "def"', '"a", "b"', '"abc";p=1',
    r'"a\b"', r'"a\"', '"a\\',
    "a b", "a\tb", '"a\tb"', "a\x01b", '"a\x00b"', '"a\x7fb"', "a\x7f", "\x85abc",
    '"caf\u00e9"', "caf\u00e9",
    '"' + "x" * 256 + '"', "x" * 256,
    '"' + "\\\\" * 256 + '"',
])
def test_invalid(raw):
    with pytest.raises(InvalidKey) as e:
        parse(raw)
    assert e.value.slug == "idempotency-key-invalid"


@pytest.mark.parametrize("raw", ["k1,k2", "k1, k2", "k1 ,k2", '"k1","k2"', '"k1", "k2"', '"k1" , "k2"', "a,b;c=d", ",k1", "k1,",
                                 ["k1", "k2"], ["k1", "k1"]])
def test_several_keys_are_invalid(raw):
    """HTTP joins two header lines with a comma: several keys are refused, even twice the same."""
    with pytest.raises(InvalidKey) as e:
        parse(raw)
    assert "several" in str(e.value)


def test_length_counts_the_unescaped_key():
    # 255 backslashes need 510 characters quoted, but the key is 255 bytes
    assert parse('"' + "\\\\" * 255 + '"') == "\\" * 255

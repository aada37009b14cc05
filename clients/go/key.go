package idempotency

import (
	"fmt"
	"strings"
)

// MaxKeyBytes is the longest key the extension accepts.
const MaxKeyBytes = 255

// KeyError is why an Idempotency-Key header was refused. Missing tells the absent header (problem type
// idempotency-key-missing) from a present but unusable one (idempotency-key-invalid).
type KeyError struct {
	Missing bool
	Reason  string
}

func (e *KeyError) Error() string { return e.Reason }

// Slug is the last segment of the problem type for this error.
func (e *KeyError) Slug() string {
	if e.Missing {
		return "idempotency-key-missing"
	}
	return "idempotency-key-invalid"
}

func invalid(format string, args ...any) *KeyError {
	return &KeyError{Reason: fmt.Sprintf(format, args...)}
}

// ParseKey parses the Idempotency-Key field values of a request (http.Header.Values("Idempotency-Key"); nil or
// empty when the header is absent).
//
// The IETF draft makes the field a Structured Field Item whose value is a String (RFC 8941 section 3.3.3):
// "abc", with \" and \\ the only escapes. Many clients send the key bare (abc, a UUID), so the bare form is
// accepted too and is the same key. Leading and trailing spaces and tabs are not part of the value; anything after
// the closing quote is refused (the draft defines no parameters). A bare key is visible ASCII (%x21-7E) without a
// double quote; a quoted key is printable ASCII (%x20-7E). The key must not be empty or over MaxKeyBytes. A field
// sent twice (two header lines, or a comma-joined list) is refused: a String Item is a single value.
func ParseKey(values []string) (string, error) {
	if len(values) == 0 {
		return "", &KeyError{Missing: true, Reason: "the Idempotency-Key header is required"}
	}
	if len(values) > 1 {
		return "", invalid("several Idempotency-Keys: the header must be sent once, with one key")
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", invalid("the Idempotency-Key header is empty")
	}
	var key string
	var err *KeyError
	if v[0] == '"' {
		key, err = parseSFString(v)
	} else {
		key, err = parseBare(v)
	}
	if err != nil {
		return "", err
	}
	if key == "" {
		return "", invalid("the Idempotency-Key header is empty")
	}
	if len(key) > MaxKeyBytes {
		return "", invalid("the Idempotency-Key is over %d bytes", MaxKeyBytes)
	}
	return key, nil
}

func isControl(c byte) bool { return c < 0x20 || c == 0x7f }

func parseSFString(v string) (string, *KeyError) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			if i+1 >= len(v) {
				return "", invalid("the Idempotency-Key ends inside an escape")
			}
			next := v[i+1]
			if next != '"' && next != '\\' {
				return "", invalid("the Idempotency-Key has an invalid escape \\%s", show(next))
			}
			b.WriteByte(next)
			i++
		case c == '"':
			if i+1 != len(v) {
				if rest := strings.TrimLeft(v[i+1:], " \t"); rest != "" && rest[0] == ',' {
					return "", invalid("several Idempotency-Keys (a comma-separated list): send one key")
				}
				return "", invalid("the Idempotency-Key has characters after its closing quote")
			}
			return b.String(), nil
		case isControl(c):
			return "", invalid("the Idempotency-Key contains a control character")
		case c > 0x7e:
			return "", invalid("the Idempotency-Key contains a character outside printable ASCII")
		default:
			b.WriteByte(c)
		}
	}
	return "", invalid("the Idempotency-Key has no closing quote")
}

func parseBare(v string) (string, *KeyError) {
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case isControl(c):
			return "", invalid("the Idempotency-Key contains a control character")
		case c == '"':
			return "", invalid("the Idempotency-Key has a quote inside a bare key")
		case c == ',':
			// HTTP joins two header lines of a field with a comma: "k1,k2" is two keys.
			return "", invalid("several Idempotency-Keys (a comma-separated list): send one key")
		case c == ' ' || c == '\t':
			if strings.Contains(v[i:], ",") {
				return "", invalid("several Idempotency-Keys (a comma-separated list): send one key")
			}
			return "", invalid("a bare Idempotency-Key must not contain white space (quote it)")
		case c > 0x7e:
			return "", invalid("a bare Idempotency-Key must be visible ASCII")
		}
	}
	return v, nil
}

func show(c byte) string {
	if c >= 0x20 && c <= 0x7e {
		return string(c)
	}
	return fmt.Sprintf("\\x%02x", c)
}

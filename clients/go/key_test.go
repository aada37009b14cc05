package idempotency

import (
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("a", MaxKeyBytes)
	tests := []struct {
		name    string
		values  []string
		key     string
		missing bool // error, idempotency-key-missing
		invalid bool // error, idempotency-key-invalid
		several bool // the detail says several keys
	}{
		{name: "absent", values: nil, missing: true},
		{name: "bare", values: []string{"abc"}, key: "abc"},
		{name: "bare uuid", values: []string{"3f6c2a9e-8d41-4b7a-9c25-1e0b7d4f6a01"}, key: "3f6c2a9e-8d41-4b7a-9c25-1e0b7d4f6a01"},
		{name: "quoted", values: []string{`"abc"`}, key: "abc"},
		{name: "quoted equals bare", values: []string{`"3f6c2a9e"`}, key: "3f6c2a9e"},
		{name: "quoted with space", values: []string{`"a b"`}, key: "a b"},
		{name: "escaped quote", values: []string{`"a\"b"`}, key: `a"b`},
		{name: "escaped backslash", values: []string{`"a\\b"`}, key: `a\b`},
		{name: "both escapes", values: []string{`"\\\""`}, key: `\"`},
		{name: "surrounding OWS", values: []string{" \t\"abc\"\t "}, key: "abc"},
		{name: "bare with OWS", values: []string{"  abc "}, key: "abc"},
		{name: "bare punctuation", values: []string{"a:b/c=d+e;f"}, key: "a:b/c=d+e;f"},
		{name: "comma inside a quoted key", values: []string{`"a,b"`}, key: "a,b"},
		{name: "two keys joined", values: []string{"k1,k2"}, invalid: true, several: true},
		{name: "two keys joined with space", values: []string{"k1, k2"}, invalid: true, several: true},
		{name: "two quoted keys", values: []string{`"k1" , "k2"`}, invalid: true, several: true},
		{name: "two header lines", values: []string{"k1", "k2"}, invalid: true, several: true},
		{name: "max length", values: []string{long}, key: long},
		{name: "max length quoted", values: []string{`"` + long + `"`}, key: long},
		{name: "empty", values: []string{""}, invalid: true},
		{name: "only spaces", values: []string{"   "}, invalid: true},
		{name: "empty quoted", values: []string{`""`}, invalid: true},
		{name: "over 255 bytes", values: []string{long + "a"}, invalid: true},
		{name: "over 255 bytes quoted", values: []string{`"` + long + `a"`}, invalid: true},
		{name: "unterminated", values: []string{`"abc`}, invalid: true},
		{name: "trailing after quote", values: []string{`"abc"x`}, invalid: true},
		{name: "parameters", values: []string{`"abc";a=1`}, invalid: true},
		{name: "list of strings", values: []string{`"a", "b"`}, invalid: true, several: true},
		{name: "bad escape", values: []string{`"a\nb"`}, invalid: true},
		{name: "escape at end", values: []string{`"abc\`}, invalid: true},
		{name: "control in quoted", values: []string{"\"a\x01b\""}, invalid: true},
		{name: "tab in quoted", values: []string{"\"a\tb\""}, invalid: true},
		{name: "DEL in quoted", values: []string{"\"a\x7fb\""}, invalid: true},
		{name: "control in bare", values: []string{"a\x00b"}, invalid: true},
		{name: "DEL in bare", values: []string{"a\x7f"}, invalid: true},
		{name: "space in bare", values: []string{"a b"}, invalid: true},
		{name: "quote in bare", values: []string{`a"b`}, invalid: true},
		{name: "non-ASCII bare", values: []string{"caf\u00e9"}, invalid: true},
		{name: "non-ASCII quoted", values: []string{"\"caf\u00e9\""}, invalid: true},
		{name: "C1 control", values: []string{"a\u0085b"}, invalid: true},
		{name: "sent twice", values: []string{"a", "b"}, invalid: true, several: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key, err := ParseKey(tc.values)
			if tc.missing || tc.invalid {
				ke, ok := err.(*KeyError)
				if !ok {
					t.Fatalf("ParseKey(%q) = %q, %v; want a *KeyError", tc.values, key, err)
				}
				if ke.Missing != tc.missing {
					t.Fatalf("ParseKey(%q): Missing = %v, want %v (%v)", tc.values, ke.Missing, tc.missing, ke)
				}
				want := "idempotency-key-invalid"
				if tc.missing {
					want = "idempotency-key-missing"
				}
				if ke.Slug() != want {
					t.Fatalf("slug %q, want %q", ke.Slug(), want)
				}
				if tc.several != strings.Contains(ke.Reason, "several") {
					t.Fatalf("ParseKey(%q): reason %q; several keys: %v", tc.values, ke.Reason, tc.several)
				}
				return
			}
			if err != nil || key != tc.key {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q", tc.values, key, err, tc.key)
			}
		})
	}
}

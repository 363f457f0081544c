package keylane

import (
	"bytes"
	"errors"
	"testing"

	"github.com/keylane/keylane/wire"
)

// Fuzz tests of the client's decoders of what workers send: each runs its
// seeds (f.Add and testdata/fuzz/<name>) with go test.

// FuzzDecodeResult: a kept outcome either decodes to what encodeResult
// writes back byte for byte, or is refused; it never panics.
func FuzzDecodeResult(f *testing.F) {
	for _, s := range []string{"", "o", "ook", "e", "eboom", "pno", "ddead", "x", "\x00"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		res, rerr, ok := decodeResult(b)
		if !ok {
			return
		}
		var re *RemoteError
		dead := errors.As(rerr, &re) && re.DeadLettered
		if rerr != nil {
			rerr = errors.New(re.Message)
			if re.Permanent {
				rerr = Permanent(rerr)
			}
		}
		if got := encodeResult(res, rerr, dead); !bytes.Equal(got, b) {
			t.Fatalf("decodeResult(%q) re-encodes as %q", b, got)
		}
	})
}

// FuzzDecodeGrouped: a grouped reply either decodes to entries that
// re-encode to the same body, with distinct grouped tokens and outcomes
// decodeResult reads, or is refused as a whole; it never panics.
func FuzzDecodeGrouped(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("G"))
	f.Add(appendGroupedEntry([]byte{groupedVersion}, "-1", resultOK, []byte("ok")))
	two := appendGroupedEntry([]byte{groupedVersion}, "-1", resultOK, []byte("ok"))
	f.Add(appendGroupedEntry(two, "-2", resultDead, []byte("refused")))
	f.Add(appendGroupedEntry(two, "-1", resultOK, nil)) // a repeated token
	f.Add([]byte("G\x02-1\xff\xff\xff\xff\x0f"))        // a length past the end
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := decodeGrouped(b)
		if err != nil {
			return
		}
		body := []byte{groupedVersion}
		seen := map[string]bool{}
		for _, e := range es {
			if seen[e.Token] || !wire.ValidGroupedToken(e.Token) {
				t.Fatalf("decodeGrouped(%q) gave token %q", b, e.Token)
			}
			seen[e.Token] = true
			if _, _, ok := decodeResult(e.Outcome); !ok || cap(e.Outcome) != len(e.Outcome) {
				t.Fatalf("decodeGrouped(%q) gave outcome %q (cap %d)", b, e.Outcome, cap(e.Outcome))
			}
			body = appendGroupedEntry(body, e.Token, e.Outcome[0], e.Outcome[1:])
		}
		if !bytes.Equal(body, b) {
			t.Fatalf("decodeGrouped(%q) re-encodes as %q", b, body)
		}
	})
}

package client

import (
	"bytes"
	"errors"
	"testing"

	"github.com/keylane/keylane/internal/core"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// Fuzz test of the client's decoder of a worker's single reply: it runs
// its seeds (f.Add and testdata/fuzz/FuzzDecodeReply) with go test.

// FuzzDecodeReply: a reply with any error header is an error with a
// message, one without is its data; it never panics.
func FuzzDecodeReply(f *testing.F) {
	f.Add([]byte("ok"), "", "", false, false)
	f.Add([]byte(nil), "boom", "permanent", true, true)
	f.Add([]byte(nil), "", "", true, false)
	f.Add([]byte(nil), "", "dead", false, true)
	f.Fuzz(func(t *testing.T, data []byte, text, kind string, hasErr, hasKind bool) {
		m := &nats.Msg{Data: data, Header: nats.Header{}}
		if hasErr {
			m.Header[wire.HeaderError] = []string{text}
		}
		if hasKind {
			m.Header[wire.HeaderErrorKind] = []string{kind}
		}
		res, err := DecodeReply(m)
		isErr := hasErr || hasKind && kind != ""
		var re *core.RemoteError
		switch {
		case isErr && (!errors.As(err, &re) || re.Message == "" || res != nil):
			t.Fatalf("reply with error header %q/%q: %q, %v; want an error with a message", text, kind, res, err)
		case !isErr && (err != nil || !bytes.Equal(res, data)):
			t.Fatalf("reply without error header: %q, %v; want its data", res, err)
		}
	})
}

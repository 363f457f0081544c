package kept

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// TestReadKeptAnswer: only a complete answer counts; anything cut short,
// unexpected or unreadable is an error (the IDs are then looked up one at
// a time), and a refusal of the form says so.
func TestReadKeptAnswer(t *testing.T) {
	const prefix = "$KV.NS_RESULTS."
	entry := func(id string, hdr map[string]string, data []byte) *nats.Msg {
		m := nats.NewMsg("_INBOX.x")
		m.Header.Set("Nats-Subject", prefix+id)
		m.Header.Set("Nats-Sequence", "7")
		for k, v := range hdr {
			m.Header.Set(k, v)
		}
		m.Data = data
		return m
	}
	status := func(code, desc string, hdr ...string) *nats.Msg {
		m := nats.NewMsg("_INBOX.x")
		m.Header.Set("Status", code)
		m.Header.Set("Description", desc)
		for i := 0; i+1 < len(hdr); i += 2 {
			m.Header.Set(hdr[i], hdr[i+1])
		}
		return m
	}
	eob := func(pending string) *nats.Msg { return status("204", "EOB", "Nats-Num-Pending", pending) }
	ok := wire.EncodeOutcome(wire.OutcomeOK, []byte("done"))
	for _, tc := range []struct {
		name    string
		msgs    []*nats.Msg
		want    map[string]string // ID → result; "" none kept
		refused bool
		fails   bool
	}{
		{name: "entries then EOB", msgs: []*nats.Msg{entry("a", nil, ok), eob("0")}, want: map[string]string{"a": "done"}},
		{name: "none kept", msgs: []*nats.Msg{status("404", "No Results")}, want: map[string]string{}},
		{name: "deleted", msgs: []*nats.Msg{entry("a", map[string]string{"KV-Operation": "DEL"}, nil), entry("b", map[string]string{"KV-Operation": "PURGE"}, ok), eob("0")}, want: map[string]string{"a": "", "b": ""}},
		{name: "marker", msgs: []*nats.Msg{entry("a", map[string]string{"Nats-Marker-Reason": "MaxAge"}, ok), eob("0")}, want: map[string]string{"a": ""}},
		{name: "cut short", msgs: []*nats.Msg{entry("a", nil, ok), eob("3")}, fails: true},
		{name: "EOB without pending", msgs: []*nats.Msg{entry("a", nil, ok), status("204", "EOB")}, fails: true},
		{name: "EOB alone", msgs: []*nats.Msg{eob("0")}, fails: true},
		{name: "load failed", msgs: []*nats.Msg{entry("a", nil, ok), status("404", "Message Not Found")}, fails: true},
		{name: "404 after entries", msgs: []*nats.Msg{entry("a", nil, ok), status("404", "No Results")}, fails: true},
		{name: "too many", msgs: []*nats.Msg{status("413", "Too Many Results")}, fails: true},
		{name: "server error", msgs: []*nats.Msg{status("500", "boom")}, fails: true},
		{name: "older server", msgs: []*nats.Msg{status("408", "Empty Request")}, refused: true},
		{name: "no responders", msgs: []*nats.Msg{status("503", "")}, refused: true},
		{name: "foreign subject", msgs: []*nats.Msg{entry("a", nil, ok), func() *nats.Msg {
			m := entry("b", nil, ok)
			m.Header.Set("Nats-Subject", "$KV.OTHER.b")
			return m
		}(), eob("0")}, fails: true},
		{name: "no sequence", msgs: []*nats.Msg{func() *nats.Msg { m := entry("a", nil, ok); m.Header.Del("Nats-Sequence"); return m }(), eob("0")}, fails: true},
		{name: "twice", msgs: []*nats.Msg{entry("a", nil, ok), entry("a", nil, ok), eob("0")}, fails: true},
		{name: "timeout", msgs: nil, fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := 0
			found, _, err := readAnswer(prefix, "", func() (*nats.Msg, error) {
				if i == len(tc.msgs) {
					return nil, context.DeadlineExceeded
				}
				i++
				return tc.msgs[i-1], nil
			})
			switch {
			case tc.refused:
				if !errors.Is(err, errLookUpRefused) {
					t.Fatalf("err %v, want a refusal", err)
				}
				return
			case tc.fails:
				if err == nil || errors.Is(err, errLookUpRefused) {
					t.Fatalf("found %v, err %v; want an error that is no refusal", found, err)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			got := map[string]string{}
			for id, k := range found {
				got[id] = ""
				if k != nil {
					got[id] = string(k.Res)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("found %v, want %v", got, tc.want)
			}
		})
	}
}

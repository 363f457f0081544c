package keylane

import (
	"context"
	"errors"
	"testing"
)

type seat struct {
	Holder string `json:"holder,omitempty"`
	Holds  int    `json:"holds"`
}

type seatReq struct {
	Who string `json:"who"`
}

type seatResp struct {
	OK     bool   `json:"ok"`
	Holder string `json:"holder"`
}

// TestTypedReducersByType: a ReducerMux of JSON reducers keeps one typed
// state per key across job types, CallJSON decodes typed responses, and
// an unknown type or a payload that is not the request type fails
// permanently without touching the state.
func TestTypedReducersByType(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	mux := NewReducerMux()
	mux.HandleType("hold", JSONReducer(func(ctx context.Context, job Job, s seat, r seatReq) (seat, seatResp, error) {
		if s.Holder != "" && s.Holder != r.Who {
			return s, seatResp{Holder: s.Holder}, nil
		}
		return seat{Holder: r.Who, Holds: s.Holds + 1}, seatResp{OK: true, Holder: r.Who}, nil
	}))
	mux.HandleType("release", JSONReducer(func(ctx context.Context, job Job, s seat, r seatReq) (seat, seatResp, error) {
		if s.Holder != r.Who {
			return s, seatResp{Holder: s.Holder}, nil
		}
		return seat{Holds: s.Holds}, seatResp{OK: true}, nil
	}))
	reducerWorker(e, "w", mux)

	steps := []struct {
		typ, who string
		want     seatResp
	}{
		{"hold", "ann", seatResp{OK: true, Holder: "ann"}},
		{"hold", "bob", seatResp{Holder: "ann"}},
		{"release", "bob", seatResp{Holder: "ann"}},
		{"release", "ann", seatResp{OK: true}},
		{"hold", "bob", seatResp{OK: true, Holder: "bob"}},
	}
	for _, s := range steps {
		got, err := CallJSON[seatResp](ctx(t), e.client, "seat:A7", seatReq{Who: s.who}, WithType(s.typ))
		if err != nil || got != s.want {
			t.Fatalf("%s by %s: %+v, %v; want %+v", s.typ, s.who, got, err, s.want)
		}
	}
	if _, err := CallJSON[seatResp](ctx(t), e.client, "seat:A7", seatReq{Who: "cy"}, WithType("upgrade")); !errors.Is(err, ErrPermanent) {
		t.Fatalf("unknown type: %v, want a permanent error", err)
	}
	if _, err := e.client.Call(ctx(t), "seat:A7", []byte("not json"), WithType("hold")); !errors.Is(err, ErrPermanent) {
		t.Fatalf("payload that is not a seatReq: %v, want a permanent error", err)
	}
	st, err := e.topo.NewState().Get(ctx(t), "seat:A7")
	if err != nil || string(st.Value) != `{"holder":"bob","holds":2}` {
		t.Fatalf("state %s, %v; want bob holding, two holds", st.Value, err)
	}
}

// TestJSONHandlerAndSubmitJSON: a JSONHandler decodes what SubmitJSON and
// CallJSON encode.
func TestJSONHandlerAndSubmitJSON(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	seen := make(chan string, 1)
	e.worker("w", JSONHandler(func(ctx context.Context, job Job, r seatReq) (seatResp, error) {
		if job.ID == "sub-1" {
			seen <- r.Who
		}
		return seatResp{OK: true, Holder: r.Who}, nil
	}), nil)
	got, err := CallJSON[seatResp](ctx(t), e.client, "seat:B1", seatReq{Who: "dee"})
	if err != nil || got != (seatResp{OK: true, Holder: "dee"}) {
		t.Fatalf("CallJSON: %+v, %v", got, err)
	}
	if _, err := SubmitJSON(ctx(t), e.client, "seat:B1", seatReq{Who: "eve"}, WithID("sub-1")); err != nil {
		t.Fatal(err)
	}
	select {
	case who := <-seen:
		if who != "eve" {
			t.Fatalf("handler decoded %q, want eve", who)
		}
	case <-ctx(t).Done():
		t.Fatal("the submitted job never ran")
	}
	if _, err := SubmitJSON(ctx(t), e.client, "seat:B1", func() {}); err == nil {
		t.Fatal("SubmitJSON of a func: no error")
	}
}

// TestResultIsOneRoundTrip: Client.Result keeps the results bucket's
// handle, so a look-up after the first is one request to the server.
func TestResultIsOneRoundTrip(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 2})
	e.worker("w", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) { return []byte("done"), nil }), func(c *WorkerConfig) { c.StoreResults = true })
	if _, err := e.client.Call(ctx(t), "k", nil, WithID("r-1")); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		before := e.nc.Stats().OutMsgs
		res, err := e.client.Result(ctx(t), "r-1")
		if err != nil || string(res) != "done" {
			t.Fatalf("Result: %q, %v", res, err)
		}
		if sent := e.nc.Stats().OutMsgs - before; i > 0 && sent != 1 {
			t.Fatalf("look-up %d sent %d messages, want 1", i+1, sent)
		}
	}
}

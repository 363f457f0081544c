package jsbatch

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBatchStoredOrRefused: on a real server, a batch of three to a
// stream that allows atomic publish is Stored (its ack names the batch
// and its size); the same batch to a stream that does not is Refused
// (the batch form itself, not a failed request), and stores nothing.
func TestBatchStoredOrRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc := natstest.Connect(t, natstest.Start(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	send := func(subject, id string) error {
		for i := 1; i <= 3; i++ {
			m := &nats.Msg{Subject: subject, Data: []byte{byte(i)}}
			Mark(m, id, i, i == 3)
			if i < 3 {
				if err := nc.PublishMsg(m); err != nil {
					return err
				}
				continue
			}
			ack, err := nc.RequestMsgWithContext(ctx, m)
			if err != nil {
				return err
			}
			return Stored(ack, id, 3)
		}
		return nil
	}
	for _, allow := range []bool{true, false} {
		name := map[bool]string{true: "ALLOW", false: "PLAIN"}[allow]
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, AllowAtomicPublish: allow})
		if err != nil {
			t.Fatal(err)
		}
		err = send(name+".x", "batch-"+name)
		info, ierr := s.Info(ctx)
		if ierr != nil {
			t.Fatal(ierr)
		}
		switch {
		case allow && (err != nil || info.State.Msgs != 3):
			t.Fatalf("%s: %v, %d stored; want the batch stored", name, err, info.State.Msgs)
		case !allow && (!Refused(err) || info.State.Msgs != 0):
			t.Fatalf("%s: %v (refused %v), %d stored; want it refused, nothing stored", name, err, Refused(err), info.State.Msgs)
		}
	}
	if Refused(context.DeadlineExceeded) || !Refused(ErrIgnored) || Refused(errors.New("no responders")) {
		t.Fatal("Refused takes a failed request for the batch form's refusal")
	}
}

// TestStoredNeedsTheBatchInTheAck: a commit's good ack counts only if
// it names the batch and its size; a server before 2.12 acks the last
// message alone.
func TestStoredNeedsTheBatchInTheAck(t *testing.T) {
	for _, tc := range []struct {
		ack  string
		want error
	}{
		{`{"stream":"KV_R","seq":7,"batch":"b1","count":3}`, nil},
		{`{"stream":"KV_R","seq":7}`, ErrIgnored},
		{`{"stream":"KV_R","seq":7,"batch":"b2","count":3}`, ErrIgnored},
		{`{"stream":"KV_R","seq":7,"batch":"b1","count":2}`, ErrIgnored},
	} {
		if err := Stored(&nats.Msg{Data: []byte(tc.ack)}, "b1", 3); !errors.Is(err, tc.want) {
			t.Errorf("Stored(%s) = %v, want %v", tc.ack, err, tc.want)
		}
	}
	var apiErr *jetstream.APIError
	if err := Stored(&nats.Msg{Data: []byte(`{"error":{"code":400,"err_code":10174,"description":"atomic publish is disabled"}}`)}, "b1", 3); !errors.As(err, &apiErr) || apiErr.ErrorCode != 10174 {
		t.Errorf("refused batch: %v", err)
	}
}

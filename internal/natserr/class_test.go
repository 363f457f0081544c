package natserr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func apiErr(status, code int, desc string) error {
	return &jetstream.APIError{Code: status, ErrorCode: jetstream.ErrorCode(code), Description: desc}
}

// TestClassify: the classes of the errors keylane meets, as nats.go
// returns them (its sentinels, APIErrors with the server's codes, and
// both wrapped the way keylane wraps them).
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want natserr.Class
	}{
		{"nil", nil, natserr.Other},
		{"canceled", context.Canceled, natserr.Other},
		{"not NATS", errors.New("boom"), natserr.Other},

		{"bad subject", nats.ErrBadSubject, natserr.Permanent},
		{"invalid key", jetstream.ErrInvalidKey, natserr.Permanent},
		{"max payload", nats.ErrMaxPayload, natserr.Permanent},
		{"max payload wrapped", fmt.Errorf("state: %w", nats.ErrMaxPayload), natserr.Permanent},
		{"permissions", fmt.Errorf("refused: %w", nats.ErrPermissionViolation), natserr.Permanent},
		{"closed", nats.ErrConnectionClosed, natserr.Permanent},
		{"message over stream max 10054", jetstream.ErrStreamMessageExceedsMaximum, natserr.Permanent},
		{"stream not found 10059", jetstream.ErrStreamNotFound, natserr.Permanent},
		{"replicas not clustered 10074", apiErr(500, 10074, "replicas > 1 not supported in non-clustered mode"), natserr.Permanent},
		{"no peers for placement 10005", apiErr(400, 10005, "no suitable peers for placement, peer offline"), natserr.Transient},
		{"member change in flight 10202", apiErr(400, 10202, "cluster member change is in progress"), natserr.Transient},
		{"schedules disabled 10188", apiErr(400, 10188, "message schedules is disabled"), natserr.Permanent},
		{"atomic publish disabled 10174", apiErr(400, 10174, "atomic publish is disabled"), natserr.Permanent},
		{"TTL disabled 10166", apiErr(400, 10166, "per-message TTL is disabled"), natserr.Permanent},
		{"per-subject cap 10077", apiErr(503, 10077, "maximum messages per subject exceeded"), natserr.Permanent},
		{"bad request 400", apiErr(400, 10003, "bad request"), natserr.Permanent},

		{"stream full 10077", apiErr(503, 10077, "maximum messages exceeded"), natserr.Limit},
		{"bucket full 10077", apiErr(503, 10077, "maximum bytes exceeded"), natserr.Limit},
		{"insufficient resources 10023", apiErr(503, 10023, "insufficient resources"), natserr.Limit},
		{"cluster not available 10008", apiErr(503, 10008, "JetStream system temporarily unavailable"), natserr.Transient},
		{"503", apiErr(503, 0, "no leader"), natserr.Transient},
		{"408", apiErr(408, 0, "request timeout"), natserr.Transient},
		{"timeout", nats.ErrTimeout, natserr.Transient},
		{"deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), natserr.Transient},
		{"no responders", nats.ErrNoResponders, natserr.Transient},
		{"no stream response", jetstream.ErrNoStreamResponse, natserr.Transient},
		{"reconnecting", nats.ErrConnectionReconnecting, natserr.Transient},
		{"disconnected", nats.ErrDisconnected, natserr.Transient},

		{"wrong last sequence 10071", apiErr(400, 10071, "wrong last sequence: 4"), natserr.Conflict},
		{"wrong last sequence R3 10164", apiErr(400, 10164, "wrong last sequence"), natserr.Conflict},
		{"key exists", jetstream.ErrKeyExists, natserr.Conflict},
		{"key exists said once", natserr.Once(fmt.Errorf("nats: %w", jetstream.ErrKeyExists)), natserr.Conflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := natserr.Classify(tc.err); got != tc.want {
				t.Fatalf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestClassifyRealRefusals: what a real server answers, classified.
func TestClassifyRealRefusals(t *testing.T) {
	srv := natstest.StartConfig(t, "max_payload: 4096\n")
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxMsgSize: 1024, MaxMsgsPerSubject: 1, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "B"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "k", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.full", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ONE", Subjects: []string{"one.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "one.a", nil); err != nil {
		t.Fatal(err)
	}
	sched := nats.NewMsg("s.sched")
	sched.Header.Set("Nats-Schedule", "@at 2099-01-01T00:00:00Z")
	sched.Header.Set("Nats-Schedule-Target", "s.x")
	batch := nats.NewMsg("s.batch")
	batch.Header.Set("Nats-Batch-Id", "b1")
	batch.Header.Set("Nats-Batch-Sequence", "1")
	batch.Header.Set("Nats-Batch-Commit", "1")
	for _, tc := range []struct {
		name string
		do   func() error
		want natserr.Class
	}{
		{"over max_payload", func() error { _, err := js.Publish(ctx, "s.big", make([]byte, 5000)); return err }, natserr.Permanent},
		{"over the stream's max message size", func() error { _, err := js.Publish(ctx, "s.mid", make([]byte, 2000)); return err }, natserr.Permanent},
		{"per-subject cap", func() error { _, err := js.Publish(ctx, "s.full", nil); return err }, natserr.Permanent},
		{"stream full", func() error { _, err := js.Publish(ctx, "one.b", nil); return err }, natserr.Limit},
		{"schedule header", func() error { _, err := js.PublishMsg(ctx, sched); return err }, natserr.Permanent},
		{"batch header", func() error { _, err := js.PublishMsg(ctx, batch); return err }, natserr.Permanent},
		{"replicas on one server", func() error {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3"}, Replicas: 3})
			return err
		}, natserr.Permanent},
		{"invalid key", func() error { _, err := kv.Put(ctx, "a..b", nil); return err }, natserr.Permanent},
		{"key exists", func() error { _, err := kv.Create(ctx, "k", nil); return natserr.Once(err) }, natserr.Conflict},
		{"wrong revision", func() error { _, err := kv.Update(ctx, "k", nil, 99); return natserr.Once(err) }, natserr.Conflict},
		{"no stream for the subject", func() error { _, err := js.Publish(ctx, "nostream", nil); return err }, natserr.Transient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if got := natserr.Classify(err); got != tc.want {
				t.Fatalf("%v: classified %v, want %v", err, got, tc.want)
			}
		})
	}
}

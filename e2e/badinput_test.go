package e2e

import (
	"context"
	"errors"
	"fmt"
	"github.com/keylane/keylane/wire"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestBadInput feeds the system what it must refuse: bad keys, payloads and
// job IDs are refused by the client with clear errors and store nothing; a
// client expecting another partition count is refused; an unknown command
// is a permanent remote error; and malformed messages put straight onto a
// partition subject are dead-lettered without hurting any worker.
func TestBadInput(t *testing.T) {
	c := startCluster(t, "e2e-badinput", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("client refuses", func(t *testing.T) {
		before := c.jobsLastSeq()
		for _, tc := range []struct {
			name    string
			key     string
			payload []byte
			opts    []keylane.SubmitOpt
			want    error
		}{
			{"empty key", "", []byte("get"), nil, partition.ErrEmptyKey},
			{"1025-byte key", strings.Repeat("k", 1025), []byte("get"), nil, partition.ErrKeyTooLong},
			{"payload over max_payload", "sku:0", make([]byte, int(c.nc.MaxPayload())+1), nil, keylane.ErrPayloadTooLarge},
			{"payload at max_payload once headers count", "sku:0", make([]byte, int(c.nc.MaxPayload())-40), nil, keylane.ErrPayloadTooLarge},
			{"job ID with a space", "sku:0", []byte("get"), []keylane.SubmitOpt{keylane.WithID("bad id")}, keylane.ErrBadJobID},
			{"job ID with a leading dot", "sku:0", []byte("get"), []keylane.SubmitOpt{keylane.WithID(".x")}, keylane.ErrBadJobID},
			{"job ID too long", "sku:0", []byte("get"), []keylane.SubmitOpt{keylane.WithID(strings.Repeat("a", 257))}, keylane.ErrBadJobID},
			{"job ID the results bucket cannot hold", "sku:0", []byte("get"), []keylane.SubmitOpt{keylane.WithID("order..1")}, keylane.ErrBadJobID},
			{"key with a trailing space", "sku:0 ", []byte("get"), nil, partition.ErrKeySpace},
			{"key with a tab", "sku\t0", []byte("get"), nil, partition.ErrKeyControl},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := c.client.Submit(ctx, tc.key, tc.payload, tc.opts...); !errors.Is(err, tc.want) {
					t.Errorf("Submit: got %v, want %v", err, tc.want)
				}
				if _, err := c.client.Call(ctx, tc.key, tc.payload, tc.opts...); !errors.Is(err, tc.want) {
					t.Errorf("Call: got %v, want %v", err, tc.want)
				}
				out, err := c.client.SubmitMany(ctx, []keylane.Request{{Key: tc.key, Payload: tc.payload, ID: idOf(tc.opts)}})
				if err != nil || len(out) != 1 || !errors.Is(out[0].Err, tc.want) {
					t.Errorf("SubmitMany: got %+v, %v; want %v", out, err, tc.want)
				}
			})
		}
		if after := c.jobsLastSeq(); after != before {
			t.Errorf("refused jobs were stored: jobs stream last sequence went from %d to %d", before, after)
		}
	})

	t.Run("partition mismatch", func(t *testing.T) {
		for _, n := range []int{partitions * 2, 1} {
			cl, err := keylane.NewClient(ctx, c.nc, keylane.ClientConfig{Namespace: c.ns, Partitions: n})
			if !errors.Is(err, keylane.ErrPartitionMismatch) {
				t.Errorf("client with %d partitions: got %v, want ErrPartitionMismatch", n, err)
			}
			if cl != nil {
				cl.Close()
			}
		}
		cl, err := keylane.NewClient(ctx, c.nc, keylane.ClientConfig{Namespace: c.ns, Partitions: partitions})
		if err != nil {
			t.Fatalf("client with the right count: %v", err)
		}
		cl.Close()
	})

	t.Run("unknown command", func(t *testing.T) {
		res, err := c.call("sku:0", "explode", keylane.WithID("explode-1"))
		var re *keylane.RemoteError
		if !errors.As(err, &re) || !re.Permanent || !re.DeadLettered {
			t.Fatalf("explode: got %q, %v (%+v); want a permanent, dead-lettered RemoteError", res, err, re)
		}
		m := c.waitDeadLetter(10*time.Second, "explode-1", func(m *jetstream.RawStreamMsg) bool { return wire.JobIDOfDead(m.Header) == "explode-1" })
		if a := m.Header.Get(keylane.HeaderAttempts); a != "1" {
			t.Errorf("explode: %s = %q, want 1 (a permanent error is not retried)", keylane.HeaderAttempts, a)
		}
		if e := m.Header.Get(keylane.HeaderError); !strings.Contains(e, "unknown operation") {
			t.Errorf("explode: %s = %q", keylane.HeaderError, e)
		}
	})

	t.Run("malformed messages", func(t *testing.T) {
		const p = 3
		subject := partition.Subject(c.ns, p, "raw")
		var elsewhere string
		for i := 0; elsewhere == ""; i++ {
			if k := fmt.Sprintf("sku:%d", i); partition.Of(k, partitions) != p {
				elsewhere = k
			}
		}
		c.setStock([]string{elsewhere}, []int64{5})
		garbage := make([]byte, 512)
		for i := range garbage {
			garbage[i] = byte(i*131 + 7)
		}
		for _, tc := range []struct {
			name string
			msg  *nats.Msg
		}{
			{"no key header", &nats.Msg{Header: nats.Header{keylane.HeaderJobID: {"raw-nokey"}}, Data: []byte("buy 1")}},
			{"key of another partition", &nats.Msg{Header: nats.Header{keylane.HeaderJobID: {"raw-wrongp"}, keylane.HeaderKey: {elsewhere}}, Data: []byte("buy 1")}},
			{"binary garbage", &nats.Msg{Data: garbage}},
			{"key not UTF-8", &nats.Msg{Header: nats.Header{keylane.HeaderKey: {"\xff\xfe\x01garbage"}}, Data: garbage[:64]}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tc.msg.Subject = subject
				ack, err := c.js.PublishMsg(ctx, tc.msg)
				if err != nil {
					t.Fatal(err)
				}
				seq := strconv.FormatUint(ack.Sequence, 10)
				m := c.waitDeadLetter(10*time.Second, "seq "+seq, func(m *jetstream.RawStreamMsg) bool { return m.Header.Get(keylane.HeaderSeq) == seq })
				if e := m.Header.Get(keylane.HeaderError); !strings.HasPrefix(e, "malformed") {
					t.Errorf("%s = %q, want it to start with \"malformed\"", keylane.HeaderError, e)
				}
				if got := m.Header.Get(keylane.HeaderPartition); got != strconv.Itoa(p) {
					t.Errorf("%s = %q, want %d", keylane.HeaderPartition, got, p)
				}
				if string(m.Data) != string(tc.msg.Data) {
					t.Errorf("dead letter body differs from the message")
				}
			})
		}
		// The job for another partition's key must not have run.
		if got := c.stock(elsewhere); got != 5 {
			t.Errorf("%s: stock %d after a misrouted \"buy 1\", want 5 (it must not run)", elsewhere, got)
		}
		c.waitJobsEmpty(10 * time.Second)
	})

	// Nothing crashed, and the workers still work.
	c.requireAlive()
	if res := c.mustCall("sku:0", "set 3"); res != "ok 3" {
		t.Errorf("set after bad input: %q", res)
	}
	if res := c.mustCall("sku:0", "buy 1"); res != "sold 2" {
		t.Errorf("purchase after bad input: %q, want \"sold 2\"", res)
	}
	c.stopGraceful(15 * time.Second)
	var total keylane.Stats
	for _, id := range []int{0, 1, 2} {
		st := readStats(t, c.worker(id))
		total.Malformed += st.Malformed
		total.DeadLettered += st.DeadLettered
	}
	if total.Malformed != 4 || total.DeadLettered != 5 {
		t.Errorf("workers counted %d malformed and %d dead-lettered messages, want 4 and 5", total.Malformed, total.DeadLettered)
	}
}

func idOf(opts []keylane.SubmitOpt) string {
	var r keylane.Request
	for _, o := range opts {
		o(&r)
	}
	return r.ID
}

// waitJobsEmpty polls until the work-queue jobs stream holds nothing: every
// job, malformed or not, was acked.
func (c *cluster) waitJobsEmpty(timeout time.Duration) {
	c.t.Helper()
	testwait.NoError(c.t, timeout, "jobs stream not empty", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := c.js.Stream(ctx, c.names.Jobs())
		if err != nil {
			return err
		}
		info, err := s.Info(ctx)
		if err == nil && info.State.Msgs > 0 {
			err = fmt.Errorf("it still holds %d messages", info.State.Msgs)
		}
		return err
	})
}

package keylane

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Helpers: storedJobs reads the jobs a stream holds, from their batch
// messages; oneJobSender sends one-job messages, as an earlier Node.js
// client and a Go client of an earlier release did, which workers now
// refuse (TestOneJobMessageIsRefused, TestMixedVersionClients).

// storedJob is one job stored in a jobs stream: one job of a batch
// message (Batch), read from its body, or a delayed job's due copy (a
// one-job message only a worker's schedule makes).
type storedJob struct {
	Seq     uint64
	Subject string // the message's: a batch's jobs share their batch's
	Batch   bool
	Index   int // in its batch; 0 for a one-job message
	ID, Key string
	// Header is a one-job message's headers, or the submitter's headers
	// a batch body carries for the job.
	Header map[string][]string
}

// storedJobs returns every job the stream name holds now, in stream
// order and, within a batch, in its body's order. A batch body that does
// not decode, or a one-job message that is no due copy (no client sends
// one), fails the test.
func storedJobs(t testing.TB, js jetstream.JetStream, name string) []storedJob {
	t.Helper()
	var out []storedJob
	for _, m := range natstest.StreamMsgs(t, js, name) {
		if _, ok := m.Header[wire.HeaderBatch]; !ok {
			if m.Header.Get(wire.HeaderDelayedID) == "" {
				t.Fatalf("stream %s, message %d: a one-job message that is no delayed job's due copy (headers %v)", name, m.Sequence, m.Header)
			}
			out = append(out, storedJob{Seq: m.Sequence, Subject: m.Subject, ID: m.Header.Get(HeaderJobID), Key: m.Header.Get(HeaderKey), Header: m.Header})
			continue
		}
		jobs, err := wire.DecodeBatch(m.Data)
		if err != nil {
			t.Fatalf("stream %s, message %d: %v", name, m.Sequence, err)
		}
		for i, j := range jobs {
			out = append(out, storedJob{Seq: m.Sequence, Subject: m.Subject, Batch: true, Index: i, ID: j.ID, Key: j.Key, Header: j.Header})
		}
	}
	return out
}

// oneJobSender publishes one-job messages by hand, in the format
// wire.Rules.Parse reads (the conformance vectors' and an earlier Node.js
// client's), which workers refuse: on the key's own subject, with
// Nats-Msg-Id (a generated ID),
// Keylane-Key, Keylane-Partitions and Nats-Expected-Stream; a Call adds
// Keylane-Reply, an inbox under the reply prefix with a base-36 token
// (no grouped mark: single replies, as the Node.js client gets), and
// Keylane-Keep-Outcome. It never sends a batch.
type oneJobSender struct {
	t     testing.TB
	e     *env
	js    jetstream.JetStream
	inbox string

	mu      sync.Mutex
	next    int
	waiters map[string]chan *nats.Msg
}

func newOneJobSender(t testing.TB, e *env, nc *nats.Conn) *oneJobSender {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s := &oneJobSender{t: t, e: e, js: js, inbox: e.topo.Meta.ReplyPrefix + newID() + ".", waiters: map[string]chan *nats.Msg{}}
	sub, err := nc.Subscribe(s.inbox+"*", func(m *nats.Msg) {
		s.mu.Lock()
		w := s.waiters[strings.TrimPrefix(m.Subject, s.inbox)]
		s.mu.Unlock()
		if w != nil {
			select {
			case w <- m:
			default: // a second reply: the Call took the first
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return s
}

// msg is the one-job message of a job of key with payload.
func (s *oneJobSender) msg(key string, payload []byte) *nats.Msg {
	n := s.e.topo.Partitions
	p := partition.Of(key, n)
	m := nats.NewMsg(partition.Subject(s.e.ns, p, key))
	m.Header[HeaderJobID] = []string{newID()}
	m.Header[HeaderKey] = []string{key}
	m.Header[HeaderPartitions] = []string{strconv.Itoa(n)}
	m.Header[expectStreamHeader] = []string{s.e.topo.Names.JobsShard(ShardOf(p, s.e.topo.Meta.Shards))}
	m.Data = payload
	return m
}

// submit stores a job of key as a one-job message.
func (s *oneJobSender) submit(ctx context.Context, key string, payload []byte) error {
	_, err := s.js.PublishMsg(ctx, s.msg(key, payload))
	return err
}

// submitAsync publishes a job of key as a one-job message without waiting
// for its stream ack; wait on the future.
func (s *oneJobSender) submitAsync(key string, payload []byte) (jetstream.PubAckFuture, error) {
	return s.js.PublishMsgAsync(s.msg(key, payload))
}

// call stores a job of key as a one-job Call and returns its reply's
// result or error.
func (s *oneJobSender) call(ctx context.Context, key string, payload []byte) ([]byte, error) {
	s.mu.Lock()
	s.next++
	token := strconv.FormatInt(int64(s.next), 36)
	w := make(chan *nats.Msg, 1)
	s.waiters[token] = w
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.waiters, token)
		s.mu.Unlock()
	}()
	m := s.msg(key, payload)
	m.Header[HeaderReply] = []string{s.inbox + token}
	m.Header[HeaderKeepOutcome] = oneHeader
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		return nil, err
	}
	select {
	case r := <-w:
		return decodeReply(r)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

package kept

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/nats-io/nats.go/jetstream"
)

// Look-ups and keeps shared across a partition's lanes.
//
// On a catalog a key's group is one job, so whatever a group does once
// it does once per job: a look-up of its kept outcomes (a JetStream API
// get per job with a caller's ID), and a keep of its outcomes (a put, an
// ack and, on a server that fsyncs every write, an fsync of the one
// results stream, which serializes them). Both amortize across keys the
// way the client's batcher does across a partition's publishes: a group
// that asks while another of the tenure's requests of its kind is in
// flight joins the next round, and each round is one request for every
// group in it (rounds). A group is answered only from a request made
// after it asked, so a shared look-up is exactly as fresh as one of its
// own: an outcome this tenure kept before the group asked is in it (the
// mark), and none can be kept for its IDs while it waits, as its key's
// lane runs nothing else meanwhile.

// rounds gathers the items (IDs to look up, outcomes to keep) of callers
// that ask while a round is in flight into the next round, sent as one
// by send. Its zero value is ready.
type rounds[T, R any] struct {
	mu       sync.Mutex
	busy     bool          // a round is in flight
	next     *round[T, R]  // the items asked for since: the next round
	gathered *atomic.Int64 // counts the rounds that gathered callers, if set

	beforeFirst func() // tests: runs before a caller that found none in flight sends
}

// round is one round's items and, once done is closed, its result.
type round[T, R any] struct {
	items   []T
	waiters int
	done    chan struct{}
	result  R
}

// do returns send(ctx, items) at once when no round is in flight, else
// the result of the next round, which holds items with those of every
// caller that asks meanwhile. A caller whose ctx ends while it waits gets
// gone(ctx) instead.
func (g *rounds[T, R]) do(ctx context.Context, items []T, send func(context.Context, []T) R, gone func(context.Context) R) R {
	g.mu.Lock()
	if !g.busy {
		g.busy = true
		hook := g.beforeFirst
		g.mu.Unlock()
		if hook != nil {
			hook()
		}
		r := send(ctx, items)
		g.sendNext(ctx, send)
		return r
	}
	r := g.next
	if r == nil {
		r = &round[T, R]{done: make(chan struct{})}
		g.next = r
	}
	r.items = append(r.items, items...)
	r.waiters++
	g.mu.Unlock()
	select {
	case <-r.done:
		return r.result
	case <-ctx.Done():
		return gone(ctx)
	}
}

// sendNext sends the round that gathered while one was in flight, if
// any, from a goroutine of its own (the caller that ended the previous
// round goes on with its group), and so on until none gathered.
func (g *rounds[T, R]) sendNext(ctx context.Context, send func(context.Context, []T) R) {
	g.mu.Lock()
	r := g.next
	g.next = nil
	if r == nil {
		g.busy = false
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	if g.gathered != nil {
		g.gathered.Add(1)
	}
	go func() {
		r.result = send(ctx, r.items)
		close(r.done)
		g.sendNext(ctx, send)
	}()
}

// waiting returns how many callers wait for the next round (tests).
func (g *rounds[T, R]) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.next == nil {
		return 0
	}
	return g.next.waiters
}

// inFlight reports whether a round is in flight (tests).
func (g *rounds[T, R]) inFlight() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.busy
}

// LookUpShared is LookUp for the concurrent callers of one tenure (its
// lanes): it returns what LookUp returns for ids, but the IDs of callers
// that ask while a round is in flight go together in the next round. A
// round of one ID settles nothing (the per-ID look-up's, as LookUp). The
// map returned may hold other callers' IDs too; it must not be changed.
// When ctx ends while the caller waits it returns nil (nothing settled).
func (s *Store) LookUpShared(ctx context.Context, ids []string) map[string]*Outcome {
	if len(ids) == 0 {
		return nil
	}
	return s.lookUps.do(ctx, ids, s.LookUp, func(context.Context) map[string]*Outcome { return nil })
}

// KeepShared stores puts, a group's outcomes: at once when no keep of the
// tenure is in flight, else with the puts of every group that asks
// meanwhile, in the next round. A round goes as atomic batches
// (KeepBatched) when it holds at least Config.BatchMin puts and the batch
// form is on, else one put at a time (PutEach). It returns nil once
// every put of the round is stored (each acked), else the round's error:
// the caller tries its own puts again (a put stored twice is the same
// value under the same key). A caller whose ctx ends while it waits gets
// ctx's error. With no BatchMin it is PutEach(ctx, puts): without a
// batch a round would only make groups wait for each other.
func (s *Store) KeepShared(ctx context.Context, puts []Put) error {
	if s.min == 0 {
		return s.PutEach(ctx, puts)
	}
	if len(puts) == 0 {
		return nil
	}
	return s.keeps.do(ctx, puts, s.keepRound, context.Cause)
}

// keepRound stores one round's puts: as atomic batches where it may,
// else one by one.
func (s *Store) keepRound(ctx context.Context, puts []Put) error {
	if sent, err := s.KeepBatched(ctx, puts); sent || err != nil {
		return err
	}
	return s.PutEach(ctx, puts)
}

// PutEach stores puts as asynchronous publishes and waits for every ack
// (within core.RequestTimeout), noting each as kept (NoteKept).
func (s *Store) PutEach(ctx context.Context, puts []Put) error {
	futures := make([]jetstream.PubAckFuture, 0, len(puts))
	for _, p := range puts {
		f, err := s.js.PublishAsync(p.Subject, p.Value)
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	timeout := time.NewTimer(core.RequestTimeout)
	defer timeout.Stop()
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			s.NoteKept(puts[i].Subject, ack.Sequence)
		case err := <-f.Err():
			return err
		case <-timeout.C:
			return errors.New("no ack in time")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

package kept

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/keylane/keylane/internal/core"
	"github.com/nats-io/nats.go/jetstream"
)

// Look-ups shared across a partition's lanes.
//
// On a catalog a key's group is one job, so a look-up per group is a
// look-up per job: one leader get (a JetStream API request) for every
// job with a caller's ID. LookUpShared amortizes across keys instead, as
// the client's batcher does across a partition's publishes: a group that
// asks while another look-up of the tenure is in flight joins the next
// round, and each round is one batched request (LookUp) for every ID its
// groups asked for. A group is answered only from a request made after
// it asked, so a shared answer is exactly as fresh as one of its own: an
// outcome this tenure kept before the group asked is in it (the mark),
// and none can be kept for its IDs while it waits, as its key's lane runs
// nothing else meanwhile.

// rounds is the state of a Store's shared look-ups.
type rounds struct {
	mu   sync.Mutex
	busy bool   // a round is in flight
	next *round // the IDs asked since: the next round

	beforeFirst func() // tests: runs before a caller that found none in flight asks
}

// round is one batched request made for the groups that asked while the
// previous one was in flight.
type round struct {
	ids     []string
	waiters int
	done    chan struct{}
	settled map[string]*Outcome
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
	s.rounds.mu.Lock()
	if !s.rounds.busy {
		s.rounds.busy = true
		hook := s.rounds.beforeFirst
		s.rounds.mu.Unlock()
		if hook != nil {
			hook()
		}
		settled := s.LookUp(ctx, ids)
		s.nextRound(ctx)
		return settled
	}
	r := s.rounds.next
	if r == nil {
		r = &round{done: make(chan struct{})}
		s.rounds.next = r
	}
	r.ids = append(r.ids, ids...)
	r.waiters++
	s.rounds.mu.Unlock()
	select {
	case <-r.done:
		return r.settled
	case <-ctx.Done():
		return nil
	}
}

// nextRound sends the round that gathered while one was in flight, if
// any, from a goroutine of its own (the caller that ended the previous
// round goes on with its group), and so on until none gathered.
func (s *Store) nextRound(ctx context.Context) {
	s.rounds.mu.Lock()
	r := s.rounds.next
	s.rounds.next = nil
	if r == nil {
		s.rounds.busy = false
		s.rounds.mu.Unlock()
		return
	}
	s.rounds.mu.Unlock()
	s.mem.sharedRounds.Add(1)
	go func() {
		r.settled = s.LookUp(ctx, r.ids)
		close(r.done)
		s.nextRound(ctx)
	}()
}

// Outcome keeps shared across a partition's lanes.
//
// Where outcomes go as atomic batches (Config.BatchMin: a replicated
// namespace, or a server that fsyncs every write), a group of one job
// (a catalog's) is one put, one ack and one fsync or replicated proposal
// of the results stream, which serializes them: the groups of a
// partition ready at once (an Applier's joined transaction commits many
// keys' groups together) each waited their turn. KeepShared gathers the
// puts of the groups that ask while a keep of the tenure is in flight
// into the next round, one atomic batch when it holds at least BatchMin
// puts (else one by one, as a group's own). Without BatchMin each group
// keeps its own at once: a round only pays when it is one batch.

// keepRounds is the state of a Store's shared keeps.
type keepRounds struct {
	mu   sync.Mutex
	busy bool       // a round is in flight
	next *keepRound // the puts asked for since: the next round

	beforeFirst func() // tests: runs before a caller that found none in flight keeps
}

// keepRound is one round of puts, for the groups that asked while the
// previous one was in flight.
type keepRound struct {
	puts    []Put
	waiters int
	done    chan struct{}
	err     error
}

// KeepShared stores puts, a group's outcomes: at once when no keep of the
// tenure is in flight, else with the puts of every group that asks
// meanwhile, in the next round. A round goes as atomic batches
// (KeepBatched) when it holds at least Config.BatchMin puts and the batch
// form is on, else one put at a time (PutEach). It returns nil once
// every put of the round is stored (each acked), else the round's error:
// the caller tries its own puts again (a put stored twice is the same
// value under the same key). A caller whose ctx ends while it waits gets
// ctx's error. With no BatchMin it is PutEach(ctx, puts).
func (s *Store) KeepShared(ctx context.Context, puts []Put) error {
	if s.min == 0 {
		return s.PutEach(ctx, puts)
	}
	if len(puts) == 0 {
		return nil
	}
	s.keeps.mu.Lock()
	if !s.keeps.busy {
		s.keeps.busy = true
		hook := s.keeps.beforeFirst
		s.keeps.mu.Unlock()
		if hook != nil {
			hook()
		}
		err := s.keepRound(ctx, puts)
		s.nextKeep(ctx)
		return err
	}
	r := s.keeps.next
	if r == nil {
		r = &keepRound{done: make(chan struct{})}
		s.keeps.next = r
	}
	r.puts = append(r.puts, puts...)
	r.waiters++
	s.keeps.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// keepRound stores one round's puts: as atomic batches where it may,
// else one by one.
func (s *Store) keepRound(ctx context.Context, puts []Put) error {
	if sent, err := s.KeepBatched(ctx, puts); sent || err != nil {
		return err
	}
	return s.PutEach(ctx, puts)
}

// nextKeep stores the round that gathered while one was in flight, if
// any, from a goroutine of its own, and so on until none gathered.
func (s *Store) nextKeep(ctx context.Context) {
	s.keeps.mu.Lock()
	r := s.keeps.next
	s.keeps.next = nil
	if r == nil {
		s.keeps.busy = false
		s.keeps.mu.Unlock()
		return
	}
	s.keeps.mu.Unlock()
	s.mem.sharedKeeps.Add(1)
	go func() {
		r.err = s.keepRound(ctx, r.puts)
		close(r.done)
		s.nextKeep(ctx)
	}()
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

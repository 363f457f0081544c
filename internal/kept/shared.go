package kept

import (
	"context"
	"sync"
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

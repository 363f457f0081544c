package tenure

import (
	"github.com/keylane/keylane/internal/kept"
	"github.com/nats-io/nats.go"
)

// A tenure's kept outcomes live in internal/kept (a kept.Store per owner,
// built by New from the Config and the worker's shared kept.Memory):
// look-ups by job ID, outcomes kept as one atomic batch, batch entries.
// Here is the owner's side: its tasks and its dead letters, under the
// names the tenure calls internal/kept's by.

type (
	keptStore = kept.Store
	// kvPut is one kept outcome: its subject in the results bucket and
	// its encoded value.
	kvPut = kept.Put
	// unreadableOutcomeError says a job's kept outcome cannot be read: it
	// is dead-lettered, never run again (deadLetterUnreadable).
	unreadableOutcomeError = kept.UnreadableError
)

var errNoEntry = kept.ErrNoEntry

// lookUpKeptBatch resolves in batched requests (kept.Store.LookUpShared:
// one request for the groups of every lane that ask meanwhile) the
// kept outcomes of the tasks of ts that have a caller's ID and were not
// looked up yet this tenure: it sets t.kept (found) or t.lookedUp (a
// definite "none"), and leaves a task untouched when the answer about its
// ID was not definite, for the per-ID look-up to settle.
func (o *Owner) lookUpKeptBatch(ts []*task) {
	n := 0
	for _, t := range ts {
		if t.explicit && !t.lookedUp && t.kept == nil {
			n++
		}
	}
	if n == 0 {
		return
	}
	ids := make([]string, 0, n)
	for _, t := range ts {
		if t.explicit && !t.lookedUp && t.kept == nil {
			ids = append(ids, t.job.ID)
		}
	}
	settled := o.kept.LookUpShared(o.ctx, ids) // with the other lanes' groups asking meanwhile
	if len(settled) == 0 {
		return
	}
	for _, t := range ts {
		if !t.explicit || t.lookedUp || t.kept != nil {
			continue
		}
		switch k, ok := settled[t.job.ID]; {
		case !ok:
		case k != nil:
			t.kept = &keptOutcome{res: k.Res, err: k.Err}
		default:
			t.lookedUp = true
		}
	}
}

// keptValue reads the last entry of job id in the results bucket
// (kept.Value): its outcome, or nil when none is kept.
func keptValue(id string, h nats.Header, data []byte) *keptOutcome {
	k := kept.Value(id, h, data)
	if k == nil {
		return nil
	}
	return &keptOutcome{res: k.Res, err: k.Err}
}

// The results bucket's reads and stream flags, internal/kept's.
var (
	leaderGet = kept.LeaderGet
	kvRemoved = kept.Removed
)

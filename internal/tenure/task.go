package tenure

import (
	"context"
	"time"

	"github.com/keylane/keylane/internal/core"
	lane "github.com/keylane/keylane/internal/lanes"
	"github.com/nats-io/nats.go/jetstream"
)

// The tenure's job in the lanes. The import is named lane because the
// tenure's lanes (below) keep the name its code calls them by.

// task is one fetched job waiting in, or running from, its key's lane.
type task struct {
	msg jetstream.Msg
	job core.Job
	// batch is the batch message the job came in, nil for a delayed
	// job's due copy. A job of a batch of several is never handed back
	// (the message cannot be half-acked or half-NAKed: batchpart.go), so
	// a lane's gap holds jobs that came alone (a batch of one, whose
	// message is handed back whole), by sequence.
	batch    *batchMsg
	maybeDup bool // may have run before under an earlier owner
	explicit bool // its ID was the caller's (or a re-publish): look it up, keep its outcome
	keep     bool // keep its outcome by ID (a Call)
	// keptInBatch: its outcome is kept in its batch's entry instead of by
	// ID (batchoutcomes.go).
	keptInBatch bool
	// redriveOf is the ID of the dead-lettered job this one redrives: its
	// outcome is kept under that ID too (Client.Redrive) once its redrive
	// ticket was found (redriveChecked; checkRedrive).
	redriveOf      string
	redriveChecked bool
	// deadInBatch: a job of a batch, dead-lettered here. Its outcome is
	// kept by its ID before it is settled, whatever else keeps it: the
	// batch message is acked only once its other jobs settle, and a
	// redelivery of it must find the dead letter's outcome instead of
	// running the job again (process looks up every redelivered batch
	// job by ID).
	deadInBatch bool

	kept        *keptOutcome // an earlier run's outcome, found by ID
	lookedUp    bool         // its kept outcome was looked for (none found) this tenure
	outcomeKept bool         // this run's outcome is stored already
	replied     bool         // answered in a grouped reply (replyGrouped)
	firstErr    error        // the error of a first run already made in a group

	// For WorkerObserver: when the jobs stream stored it, and whether it
	// was taken to run once.
	stored  time.Time
	started bool

	mark lane.Mark // what its key's lane notes on it
}

// A task waits and runs in its key's lane (internal/lanes).
var _ lane.Task = (*task)(nil)

func (t *task) Pos() lane.Position   { return lane.Position{Seq: t.job.Seq, Index: t.job.Index()} }
func (t *task) Key() string          { return t.job.Key }
func (t *task) Part() bool           { return t.batch != nil && t.batch.jobs > 1 }
func (t *task) MaybeDup() bool       { return t.maybeDup }
func (t *task) SetMaybeDup(dup bool) { t.maybeDup = dup }
func (t *task) Mark() *lane.Mark     { return &t.mark }

// keptOutcome is a job's outcome as stored by ID.
type keptOutcome struct {
	res []byte
	err error
}

// lanes are one partition's lanes of tasks (internal/lanes) under the
// names the tenure calls them by. Its methods are lane.Lanes's.
type lanes struct{ l *lane.Lanes[*task] }

func newLanes(runners, group, window int, run func([]*task)) *lanes {
	return &lanes{lane.New(lane.Config[*task]{Runners: runners, Group: group, Window: window, Run: run})}
}

func (l *lanes) addTo(t *task) (ok, handBack, stalled bool)      { return l.l.AddTo(t) }
func (l *lanes) stall(key string, stalled bool) []*task          { return l.l.Stall(key, stalled) }
func (l *lanes) waitRoom() (back, stalledBack []*task)           { return l.l.WaitRoom() }
func (l *lanes) wake()                                           { l.l.Wake() }
func (l *lanes) requeue(key string, ts []*task)                  { l.l.Requeue(key, ts) }
func (l *lanes) touch(age time.Duration, fn func(*task))         { l.l.Touch(age, fn) }
func (l *lanes) pause(ctx context.Context, d time.Duration) bool { return l.l.Pause(ctx, d) }
func (l *lanes) handedBackNow() int                              { return l.l.HandedBack() }
func (l *lanes) pending() int                                    { return l.l.Pending() }
func (l *lanes) close(drop bool)                                 { l.l.Close(drop) }

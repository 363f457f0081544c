package sale

import (
	"bufio"
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/keylane/keylane"
)

// Tracker watches handler runs in one process: the most runs of one key seen
// at the same time (keylane promises 1), and runs of a key that started out
// of stream order. With a writer it also logs every run as a JSON line, so
// runs in several processes can be checked together (see Span).
// It is safe for concurrent use.
type Tracker struct {
	mu      sync.Mutex
	keys    map[string]*keyTrack
	maxConc int
	order   int
	runs    int64
	out     *bufio.Writer
	pending map[position]*Span // runs whose outcome is not known, when tracing
	worker  string
}

type keyTrack struct {
	running int
	last    position
}

// position is a job's place in the stream: its message's sequence and its
// index in a batch message (jobs of one batch share the sequence).
type position struct {
	seq   uint64
	index int
}

func positionOf(job keylane.Job) position { return position{job.Seq, job.Index()} }

func (p position) before(q position) bool {
	return p.seq < q.seq || p.seq == q.seq && p.index < q.index
}

// OpHeader is a header a caller may set on a job to name it in the trace
// (Span.Op) when it lets keylane choose the job's ID: a Call without
// WithID learns no ID, yet its run must be matched to it.
const OpHeader = "Sale-Op"

// Span is one handler run as a trace line records it.
type Span struct {
	Worker string `json:"w"`
	Job    string `json:"job"`
	Key    string `json:"key"`
	Seq    uint64 `json:"seq"`
	// Index is the job's place in its batch message, 0 for a one-job
	// message: the stream order is (Seq, Index).
	Index int `json:"index,omitempty"`
	// Op is the job's OpHeader, if it had one.
	Op      string `json:"op,omitempty"`
	Fence   uint64 `json:"fence"`
	Start   int64  `json:"start"` // wall clock, ns
	End     int64  `json:"end"`
	Applied bool   `json:"applied"` // the state write of this run took effect
	// Settled is when the run's write outcome was known (wall clock, ns):
	// after End for a group commit, whose write follows the runs.
	Settled int64 `json:"settled,omitempty"`
	// Unknown: the run's write was sent and its answer never came
	// (cancelled or timed out: keylane.UncertainCommitObserver), so it
	// may have taken effect though Applied is false.
	Unknown bool `json:"unknown,omitempty"`
}

// NewTracker returns a tracker; out, if not nil, receives a JSON line per
// run, tagged with worker.
func NewTracker(out io.Writer, worker string) *Tracker {
	t := &Tracker{keys: map[string]*keyTrack{}, worker: worker, pending: map[position]*Span{}}
	if out != nil {
		t.out = bufio.NewWriterSize(out, 64<<10)
	}
	return t
}

// Start records the start of a run.
func (t *Tracker) Start(job keylane.Job) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.keys[job.Key]
	if k == nil {
		k = &keyTrack{}
		t.keys[job.Key] = k
	}
	k.running++
	if k.running > t.maxConc {
		t.maxConc = k.running
	}
	pos := positionOf(job)
	if pos.before(k.last) {
		t.order++
	}
	k.last = pos
	t.runs++
	if t.out != nil {
		t.pending[pos] = &Span{Worker: t.worker, Job: job.ID, Key: job.Key, Seq: job.Seq, Index: job.Index(),
			Op: job.Headers.Get(OpHeader), Fence: job.Fence, Start: time.Now().UnixNano()}
	}
}

// End records the end of a run.
func (t *Tracker) End(job keylane.Job) {
	end := time.Now().UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	if k := t.keys[job.Key]; k != nil {
		k.running--
		if k.running == 0 && len(t.keys) > 1<<16 {
			delete(t.keys, job.Key)
		}
	}
	if r := t.pending[positionOf(job)]; r != nil {
		r.End = end
	}
}

// Outcome records whether an ended run's state write took effect, which
// may be known only after End (group commit), and logs the run.
func (t *Tracker) Outcome(job keylane.Job, applied bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.pending[positionOf(job)]
	if r == nil {
		return
	}
	delete(t.pending, positionOf(job))
	r.Applied, r.Settled = applied, time.Now().UnixNano()
	b, _ := json.Marshal(r)
	_, _ = t.out.Write(append(b, '\n'))
	_ = t.out.Flush()
}

// OutcomeUnknown records that an ended run's state write was sent and
// its outcome is unknown (it may have landed), and logs the run.
func (t *Tracker) OutcomeUnknown(job keylane.Job) {
	t.mu.Lock()
	r := t.pending[positionOf(job)]
	if r != nil {
		r.Unknown = true
	}
	t.mu.Unlock()
	t.Outcome(job, false)
}

// MaxConcurrent returns the most runs of one key seen at the same time.
func (t *Tracker) MaxConcurrent() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maxConc
}

// OrderViolations returns how many runs started with a lower sequence than
// an earlier run of the same key.
func (t *Tracker) OrderViolations() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.order
}

// Runs returns how many runs started.
func (t *Tracker) Runs() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.runs
}

package keylane

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
)

// deadThenSlow runs the jobs of TestDeadLetteredJobOfABatchNeverRunsAgain:
// job dead is refused for good while refuse is set, job slow holds its
// runner once until release, the others count. It counts every run and
// every application of each job.
type deadThenSlow struct {
	dead, slow string
	refuse     atomic.Bool
	once       sync.Once
	hit        chan struct{}
	release    chan struct{}

	mu      sync.Mutex
	runs    map[string]int
	applied map[string]int
}

func (d *deadThenSlow) run(j Job) error {
	d.mu.Lock()
	d.runs[j.ID]++
	d.mu.Unlock()
	if j.ID == d.dead && d.refuse.Load() {
		return Permanent(errors.New("refused for good"))
	}
	if j.ID == d.slow {
		d.once.Do(func() {
			close(d.hit)
			<-d.release
		})
	}
	return nil
}

func (d *deadThenSlow) count(m map[string]int, id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return m[id]
}

// Reduce is a counting reducer's; Committed counts applications.
func (d *deadThenSlow) Reduce(_ context.Context, j Job, cur []byte) ([]byte, []byte, error) {
	if err := d.run(j); err != nil {
		return nil, nil, err
	}
	n, _ := strconv.Atoi(string(cur))
	return []byte(strconv.Itoa(n + 1)), nil, nil
}

func (d *deadThenSlow) Committed(j Job, applied bool) {
	if applied {
		d.mu.Lock()
		d.applied[j.ID]++
		d.mu.Unlock()
	}
}

// Handle is a plain handler's: a run that returns nil is applied.
func (d *deadThenSlow) Handle(_ context.Context, j Job) ([]byte, error) {
	if err := d.run(j); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.applied[j.ID]++
	d.mu.Unlock()
	return nil, nil
}

// TestDeadLetteredJobOfABatchNeverRunsAgain: one job of a batch (a Call)
// is dead-lettered while another job of the same batch still runs, so
// the batch message is not acked; then its owner dies (its connection
// closed). The next owner gets the batch again. The dead-lettered job is
// its key's last, so neither the key's state nor its order stops it, and
// whatever refused it no longer does: it ran and was applied, its dead
// letter still standing (a redrive would apply it twice). It must be
// answered from its outcome (dead-lettered) without running, for a
// Reducer and for a plain Handler.
func TestDeadLetteredJobOfABatchNeverRunsAgain(t *testing.T) {
	for _, kind := range []string{"reducer", "handler"} {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, TopologyConfig{Partitions: 1})
			const name = "dead-then-crash"
			id := testBatchID(name)
			d := &deadThenSlow{dead: wire.BatchedJobID(id, 0), slow: wire.BatchedJobID(id, 1),
				hit: make(chan struct{}), release: make(chan struct{}), runs: map[string]int{}, applied: map[string]int{}}
			d.refuse.Store(true)
			var releaseOnce sync.Once
			release := func() { releaseOnce.Do(func() { close(d.release) }) }
			t.Cleanup(release) // before w1's Stop: a failed test frees the runner
			start := func(wid string) *Worker {
				return e.worker(wid, nil, func(c *WorkerConfig) {
					if kind == "reducer" {
						c.Handler, c.Reducer = nil, d
					} else {
						c.Handler = d
					}
				})
			}
			replies := make(chan *nats.Msg, 4)
			sub, err := e.nc.ChanSubscribe("_INBOX.deadbatch.x0", replies)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })

			w1 := start("w1")
			e.waitOwned(w1)
			e.publishBatch(0, name, []wire.BatchJob{
				{Key: "seat:a", Reply: "_INBOX.deadbatch.x0", KeepOutcome: true, Payload: []byte("dead")},
				{Key: "seat:b", Payload: []byte("slow")},
			})
			testwait.Until(t, 10*time.Second, "the slow job running", func() (struct{}, bool) {
				select {
				case <-d.hit:
					return struct{}{}, true
				default:
					return struct{}{}, false
				}
			})
			// The dead letter is stored, its outcome kept and its caller
			// answered: all that precedes its settling in the batch.
			m := testwait.Until(t, 10*time.Second, "the dead-lettered job answered", func() (*nats.Msg, bool) {
				select {
				case m := <-replies:
					return m, true
				default:
					return nil, false
				}
			})
			var re *RemoteError
			if _, err := decodeReply(m); !errors.As(err, &re) || !re.DeadLettered {
				t.Fatalf("the job's first answer = %v, want a dead letter's", err)
			}
			if n := len(e.deadLetters()); n != 1 {
				t.Fatalf("%d dead letters before the crash, want 1", n)
			}
			// The crash: w1's connection goes while the slow job runs, so
			// the batch message is never acked; its lease expires.
			w1.nc.Close()
			release()
			if e.streamMsgs(e.topo.Names.Jobs()) != 1 {
				t.Fatal("the batch message was acked before every job of it was settled")
			}
			runs := d.count(d.runs, d.dead)
			d.refuse.Store(false) // whatever refused it would now let it run

			start("w2")
			testwait.Eventually(t, 20*time.Second, "the redelivered batch acked", func() bool {
				return e.streamMsgs(e.topo.Names.Jobs()) == 0
			})
			if n := d.count(d.runs, d.dead) - runs; n != 0 || d.count(d.applied, d.dead) != 0 {
				t.Fatalf("the dead-lettered job ran %d times after the crash and was applied %d times, its dead letter standing (state of its key %q); want it answered from its outcome, never run again",
					n, d.count(d.applied, d.dead), e.stateOf("seat:a"))
			}
			if n := len(e.deadLetters()); n != 1 {
				t.Fatalf("%d dead letters after the redelivery, want 1", n)
			}
			if d.count(d.applied, d.slow) < 1 {
				t.Fatal("the slow job was never applied")
			}
			if kind == "reducer" && (e.stateOf("seat:a") != "" || e.stateOf("seat:b") != "1") {
				t.Fatalf("states a=%q b=%q, want none and 1", e.stateOf("seat:a"), e.stateOf("seat:b"))
			}
		})
	}
}

package keylane

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// prunerApplier is a GroupApplier that keeps a record in memory, for the
// worker's pruning schedule: it applies every job, and records the
// prunes asked of it.
type prunerApplier struct {
	keep time.Duration
	mu   sync.Mutex
	cuts []time.Time
}

func (a *prunerApplier) ApplyGroup(ctx context.Context, g JobGroup) ([]JobOutcome, error) {
	out := make([]JobOutcome, len(g.Jobs))
	for i := range out {
		out[i] = JobOutcome{Result: []byte("ok"), Done: true}
	}
	return out, nil
}

func (a *prunerApplier) ReadRecord(ctx context.Context, namespace string, ids []string) (map[string][]byte, error) {
	return map[string][]byte{}, nil
}

func (a *prunerApplier) RecordRetention() time.Duration { return a.keep }

func (a *prunerApplier) PruneRecord(ctx context.Context, namespace string, before time.Time) (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cuts = append(a.cuts, before)
	return 0, nil
}

// TestRecordRetentionShorterThanAJobCanComeBackIsRefused: a worker whose
// Applier keeps outcomes for less than MinRecordRetention (here a
// minute, against the results TTL's hour) is refused at Start with
// ErrRecordRetention, its message naming the bound; one at the bound
// starts, prunes a lease TTL after Start, and asks for outcomes older
// than its retention.
func TestRecordRetentionShorterThanAJobCanComeBackIsRefused(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	nc := e.nc
	short := &prunerApplier{keep: time.Minute}
	w, err := NewWorker(nc, WorkerConfig{Topology: e.topo.Config, Applier: short, ID: "short"})
	if err != nil {
		t.Fatal(err)
	}
	err = w.Start(ctx(t))
	if !errors.Is(err, ErrRecordRetention) {
		t.Fatalf("Start with a retention of a minute: %v, want ErrRecordRetention", err)
	}
	t.Log(err)
	_ = w.Stop(ctx(t))

	cfg := WorkerConfig{Topology: e.topo.Config, Applier: &prunerApplier{}, MaxDeliver: DefaultMaxDeliver, AckWait: 5 * time.Second}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	least := MinRecordRetention(cfg)
	if least < time.Hour {
		t.Fatalf("MinRecordRetention %s is below the results TTL", least)
	}
	ok := &prunerApplier{keep: least}
	start := time.Now()
	e.worker("ok", nil, func(c *WorkerConfig) {
		c.Handler, c.Applier, c.MaxDeliver, c.AckWait = nil, ok, DefaultMaxDeliver, 5*time.Second
	})
	testwait.Eventually(t, 20*time.Second, "the worker pruned", func() bool {
		ok.mu.Lock()
		defer ok.mu.Unlock()
		return len(ok.cuts) > 0
	})
	ok.mu.Lock()
	cut := ok.cuts[0]
	ok.mu.Unlock()
	if want := start.Add(-least); cut.After(want.Add(time.Minute)) || cut.Before(want.Add(-time.Minute)) {
		t.Fatalf("the prune cut at %s, want about %s (its retention %s ago)", cut, want, least)
	}
}

// TestRecordPruneSparesPendingJobs: a prune never deletes an outcome
// recorded after the oldest job still in the jobs stream was published
// (less a minute for the clocks): such a job may still come back, and
// its outcome must answer it. A job held unacked by its handler is in
// the stream; the prune's bound, asked with no retention at all, is at
// least a minute before its publish; once it is acked, the bound is the
// retention's.
func TestRecordPruneSparesPendingJobs(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	started := make(chan struct{}, 1)
	w := e.worker("a", HandlerFunc(func(ctx context.Context, job Job) ([]byte, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		return []byte("ok"), nil
	}), nil)
	e.waitOwned(w)
	published := time.Now()
	if _, err := e.client.Submit(ctx(t), "k", []byte("x")); err != nil {
		t.Fatal(err)
	}
	<-started
	before, err := w.recordPruneBefore(ctx(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	if bound := published.Add(-recordClockMargin + time.Second); before.After(bound) {
		t.Fatalf("with a job pending since %s the prune cuts at %s: it would delete outcomes of jobs that may come back", published, before)
	}
	free()
	testwait.Eventually(t, 20*time.Second, "the job acked (the stream empty)", func() bool { return e.streamMsgs(e.topo.Names.Jobs()) == 0 })
	now := time.Now()
	before, err = w.recordPruneBefore(ctx(t), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d := now.Add(-time.Hour).Sub(before); d > time.Second || d < -time.Second {
		t.Fatalf("with no job pending the prune cuts at %s, want its retention's %s", before, now.Add(-time.Hour))
	}
}

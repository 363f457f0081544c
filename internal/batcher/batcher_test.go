package batcher

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 10 * time.Second // a deadline for what must happen, never a pause

// call is one Send the test answers.
type call struct {
	part    int
	jobs    []int
	ctx     context.Context
	release chan []Outcome[int]
}

// sender records Sends and blocks each until the test releases it.
type sender struct {
	calls    chan *call
	inflight [16]atomic.Int32
	overlap  atomic.Bool // two sends of one partition at once
}

func newSender() *sender { return &sender{calls: make(chan *call, 64)} }

func (s *sender) send(ctx context.Context, part int, jobs []int) []Outcome[int] {
	if s.inflight[part].Add(1) > 1 {
		s.overlap.Store(true)
	}
	defer s.inflight[part].Add(-1)
	c := &call{part: part, jobs: jobs, ctx: ctx, release: make(chan []Outcome[int], 1)}
	s.calls <- c
	select {
	case out := <-c.release:
		return out
	case <-ctx.Done():
		out := make([]Outcome[int], len(jobs))
		for i := range out {
			out[i].Err = ctx.Err()
		}
		return out
	}
}

// next returns the next Send, or fails the test.
func (s *sender) next(t *testing.T) *call {
	t.Helper()
	return testwait.Until(t, wait, "a send", func() (*call, bool) {
		select {
		case c := <-s.calls:
			return c, true
		default:
			return nil, false
		}
	})
}

// none checks that no Send is waiting to be answered now.
func (s *sender) none(t *testing.T) {
	t.Helper()
	select {
	case c := <-s.calls:
		t.Fatalf("unexpected send of %v", c.jobs)
	default:
	}
}

// echo answers every job j with 10*j.
func (c *call) echo() {
	out := make([]Outcome[int], len(c.jobs))
	for i, j := range c.jobs {
		out[i].Value = 10 * j
	}
	c.release <- out
}

type result struct {
	job, v int
	err    error
}

func newBatcher(t *testing.T, s *sender, cfg Config[int, int]) *Batcher[int, int] {
	t.Helper()
	cfg.Send = s.send
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // whatever is still in flight is cancelled
		_ = b.Close(ctx)
		if s.overlap.Load() {
			t.Error("two sends of one partition were in flight at once")
		}
	})
	return b
}

// do runs Do on a goroutine; its result arrives on the returned channel.
func do(ctx context.Context, b *Batcher[int, int], part, job int) <-chan result {
	ch := make(chan result, 1)
	go func() {
		v, err := b.Do(ctx, part, job)
		ch <- result{job, v, err}
	}()
	return ch
}

// queued waits until partition part holds n queued jobs.
func queued(t *testing.T, b *Batcher[int, int], part, n int) {
	t.Helper()
	testwait.Eventually(t, wait, fmt.Sprintf("%d jobs queued", n), func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		p := b.parts[part]
		return p != nil && len(p.queue) == n
	})
}

func get(t *testing.T, ch <-chan result) result {
	t.Helper()
	return testwait.Until(t, wait, "an outcome", func() (result, bool) {
		select {
		case r := <-ch:
			return r, true
		default:
			return result{}, false
		}
	})
}

func TestLoneJobIsSentAtOnce(t *testing.T) {
	s := newSender()
	// A linger of an hour changes nothing for a job alone.
	b := newBatcher(t, s, Config[int, int]{Linger: time.Hour})
	r := do(context.Background(), b, 0, 1)
	c := s.next(t)
	if !reflect.DeepEqual(c.jobs, []int{1}) || c.part != 0 {
		t.Fatalf("sent %v to %d, want [1] to 0", c.jobs, c.part)
	}
	c.echo()
	if got := get(t, r); got.v != 10 || got.err != nil {
		t.Fatalf("outcome %+v", got)
	}
}

// start sends job 1 of partition part and returns its unanswered Send.
func start(t *testing.T, s *sender, b *Batcher[int, int], part int) (*call, <-chan result) {
	t.Helper()
	r := do(context.Background(), b, part, 1)
	c := s.next(t)
	return c, r
}

// queue queues jobs (in this order) behind an in-flight send.
func queue(t *testing.T, b *Batcher[int, int], part int, jobs ...int) []<-chan result {
	t.Helper()
	var rs []<-chan result
	for i, j := range jobs {
		rs = append(rs, do(context.Background(), b, part, j))
		queued(t, b, part, i+1)
	}
	return rs
}

func TestJobsQueuedMeanwhileGoAsOneBatch(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{})
	first, r1 := start(t, s, b, 3)
	rs := queue(t, b, 3, 2, 3, 4, 5, 6)
	s.none(t) // nothing more goes while the first is in flight
	first.echo()
	second := s.next(t)
	if !reflect.DeepEqual(second.jobs, []int{2, 3, 4, 5, 6}) {
		t.Fatalf("second batch %v, want [2 3 4 5 6]", second.jobs)
	}
	second.echo()
	for _, r := range append(rs, r1) {
		if got := get(t, r); got.v != 10*got.job || got.err != nil {
			t.Fatalf("outcome %+v", got)
		}
	}
}

func TestBatchesCutAtCountAndBytes(t *testing.T) {
	t.Run("count", func(t *testing.T) {
		s := newSender()
		b := newBatcher(t, s, Config[int, int]{MaxCount: 3})
		first, _ := start(t, s, b, 0)
		queue(t, b, 0, 2, 3, 4, 5, 6, 7, 8)
		first.echo()
		for _, want := range [][]int{{2, 3, 4}, {5, 6, 7}, {8}} {
			c := s.next(t)
			if !reflect.DeepEqual(c.jobs, want) {
				t.Fatalf("batch %v, want %v", c.jobs, want)
			}
			c.echo()
		}
	})
	t.Run("bytes", func(t *testing.T) {
		s := newSender()
		// A job's size is its value; a job over the limit goes alone.
		b := newBatcher(t, s, Config[int, int]{MaxBytes: 10, Size: func(j int) int { return j }})
		first, _ := start(t, s, b, 0)
		queue(t, b, 0, 4, 5, 4, 20, 1)
		first.echo()
		for _, want := range [][]int{{4, 5}, {4}, {20}, {1}} {
			c := s.next(t)
			if !reflect.DeepEqual(c.jobs, want) {
				t.Fatalf("batch %v, want %v", c.jobs, want)
			}
			c.echo()
		}
	})
}

func TestEachCallerGetsItsOwnOutcome(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{})
	first, _ := start(t, s, b, 0)
	rs := queue(t, b, 0, 2, 3, 4)
	first.echo()
	c := s.next(t)
	bad := errors.New("job 3 refused")
	c.release <- []Outcome[int]{{Value: 20}, {Err: bad}, {Value: 40}}
	for i, want := range []result{{2, 20, nil}, {3, 0, bad}, {4, 40, nil}} {
		if got := get(t, rs[i]); got != want {
			t.Fatalf("job %d: %+v, want %+v", want.job, got, want)
		}
	}
}

func TestWrongOutcomeCountFailsTheBatch(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{})
	first, _ := start(t, s, b, 0)
	rs := queue(t, b, 0, 2, 3)
	first.echo()
	s.next(t).release <- []Outcome[int]{{Value: 20}}
	for _, r := range rs {
		if got := get(t, r); !errors.Is(got.err, ErrOutcomes) {
			t.Fatalf("outcome %+v, want ErrOutcomes", got)
		}
	}
}

func TestCancelWhileQueuedTakesTheJobOut(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{})
	first, _ := start(t, s, b, 0)
	ctx, cancel := context.WithCancel(context.Background())
	r2 := do(context.Background(), b, 0, 2)
	queued(t, b, 0, 1)
	r3 := do(ctx, b, 0, 3)
	queued(t, b, 0, 2)
	cancel()
	if got := get(t, r3); !errors.Is(got.err, ErrNotSent) || !errors.Is(got.err, context.Canceled) {
		t.Fatalf("cancelled queued job: %+v", got)
	}
	first.echo()
	c := s.next(t)
	if !reflect.DeepEqual(c.jobs, []int{2}) {
		t.Fatalf("batch %v, want [2]: the cancelled job went", c.jobs)
	}
	c.echo()
	if got := get(t, r2); got.v != 20 || got.err != nil {
		t.Fatalf("job 2: %+v", got)
	}
}

func TestCancelAfterSendDoesNotCancelOthers(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{})
	first, _ := start(t, s, b, 0)
	ctx, cancel := context.WithCancel(context.Background())
	r2 := do(ctx, b, 0, 2)
	queued(t, b, 0, 1)
	r3 := do(context.Background(), b, 0, 3)
	queued(t, b, 0, 2)
	first.echo()
	c := s.next(t)
	cancel()
	// The cancelled caller returns while its batch is in flight, and the
	// send's context is not cancelled with it.
	if got := get(t, r2); !errors.Is(got.err, ErrUnknown) || !errors.Is(got.err, context.Canceled) {
		t.Fatalf("cancelled sent job: %+v", got)
	}
	if c.ctx.Err() != nil {
		t.Fatal("a caller's cancel cancelled the send")
	}
	c.echo()
	if got := get(t, r3); got.v != 30 || got.err != nil {
		t.Fatalf("job 3: %+v", got)
	}
}

func TestPartitionsAreIndependent(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{})
	first, _ := start(t, s, b, 0)
	r := do(context.Background(), b, 1, 7)
	c := s.next(t) // partition 1 does not wait for partition 0
	if c.part != 1 || !reflect.DeepEqual(c.jobs, []int{7}) {
		t.Fatalf("sent %v to %d", c.jobs, c.part)
	}
	c.echo()
	first.echo()
	if got := get(t, r); got.v != 70 {
		t.Fatalf("job 7: %+v", got)
	}
}

func TestLingerHoldsAShortBatchUntilFull(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{MaxCount: 3, Linger: time.Hour})
	first, _ := start(t, s, b, 0)
	queue(t, b, 0, 2, 3)
	first.echo()
	// The send returned with two queued: they linger (an hour) ...
	testwait.Eventually(t, wait, "lingering", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.parts[0].linger != nil && !b.parts[0].inflight
	})
	s.none(t)
	// ... until a third makes the batch full.
	_ = do(context.Background(), b, 0, 4)
	c := s.next(t)
	if !reflect.DeepEqual(c.jobs, []int{2, 3, 4}) {
		t.Fatalf("batch %v, want [2 3 4]", c.jobs)
	}
	c.echo()
}

func TestLingerSendsAShortBatchInTime(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{MaxCount: 3, Linger: time.Millisecond})
	first, _ := start(t, s, b, 0)
	rs := queue(t, b, 0, 2)
	first.echo()
	c := s.next(t)
	if !reflect.DeepEqual(c.jobs, []int{2}) {
		t.Fatalf("batch %v, want [2]", c.jobs)
	}
	c.echo()
	if got := get(t, rs[0]); got.v != 20 {
		t.Fatalf("job 2: %+v", got)
	}
}

func TestCloseFailsQueuedAndWaitsForInflight(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{})
	first, r1 := start(t, s, b, 0)
	rs := queue(t, b, 0, 2, 3)
	closed := make(chan error, 1)
	go func() { closed <- b.Close(context.Background()) }()
	for _, r := range rs {
		if got := get(t, r); !errors.Is(got.err, ErrClosed) {
			t.Fatalf("queued job at close: %+v", got)
		}
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a send in flight", err)
	default:
	}
	if _, err := b.Do(context.Background(), 0, 9); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close: %v", err)
	}
	first.echo()
	if got := get(t, r1); got.v != 10 || got.err != nil {
		t.Fatalf("in-flight job: %+v", got)
	}
	if err := testwait.Until(t, wait, "Close", func() (error, bool) {
		select {
		case err := <-closed:
			return err, true
		default:
			return nil, false
		}
	}); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s.none(t)
}

func TestCloseCancelsSendsWhenItsContextEnds(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{})
	_, r1 := start(t, s, b, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Close(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close: %v", err)
	}
	if got := get(t, r1); !errors.Is(got.err, context.Canceled) {
		t.Fatalf("in-flight job of a cancelled close: %+v", got)
	}
}

func TestNewRefusesABadConfig(t *testing.T) {
	send := func(context.Context, int, []int) []Outcome[int] { return nil }
	for _, cfg := range []Config[int, int]{{}, {Send: send, MaxCount: -1}, {Send: send, Linger: -1}, {Send: send, Cork: -1}} {
		if _, err := New(cfg); err == nil {
			t.Fatalf("New(%+v) accepted", cfg)
		}
	}
}

// TestManyCallersEachGetTheirOwn: concurrent callers on a few
// partitions, sends answered as they come; every caller gets its own
// job's outcome and no partition has two sends at once (checked at
// clean-up).
func TestManyCallersEachGetTheirOwn(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{MaxCount: 7})
	stop := make(chan struct{})
	var answered sync.WaitGroup
	answered.Add(1)
	go func() { // answers every send
		defer answered.Done()
		for {
			select {
			case c := <-s.calls:
				c.echo()
			case <-stop:
				return
			}
		}
	}()
	const callers, each = 32, 50
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				job := g*each + i + 1
				v, err := b.Do(context.Background(), job%4, job)
				if err != nil || v != 10*job {
					wrong.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	answered.Wait()
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d callers got another outcome than their own", n)
	}
}

// TestSealBeforeAnyCallerSeesItsJobSent: Seal gets a batch's jobs as it is
// cut, before Send, and what it writes into them is what a caller whose
// context ends after the cut (ErrUnknown) reads, race-free.
func TestSealBeforeAnyCallerSeesItsJobSent(t *testing.T) {
	type job struct{ sealed string }
	sent := make(chan []*job, 4)
	release := make(chan struct{})
	var sealed [][]*job
	b, err := New(Config[*job, int]{
		Send: func(_ context.Context, _ int, jobs []*job) []Outcome[int] {
			sent <- jobs
			<-release
			return make([]Outcome[int], len(jobs))
		},
		Seal: func(_ int, jobs []*job) {
			sealed = append(sealed, jobs) // under the batcher's lock
			for i, j := range jobs {
				j.sealed = fmt.Sprintf("%d/%d", i, len(jobs))
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Close(context.Background()) }()
	lead := &job{}
	leadDone := make(chan error, 1)
	go func() { _, err := b.Do(context.Background(), 0, lead); leadDone <- err }()
	<-sent // the lead in flight: the next jobs queue
	quitter, other := &job{}, &job{}
	qctx, cancel := context.WithCancel(context.Background())
	quit := make(chan error, 1)
	go func() { _, err := b.Do(qctx, 0, quitter); quit <- err }()
	otherDone := make(chan error, 1)
	go func() { _, err := b.Do(context.Background(), 0, other); otherDone <- err }()
	testwait.Eventually(t, wait, "both queued", func() bool { return b.Queued(0) == 2 })
	release <- struct{}{} // the lead returns; the two go as one batch
	<-sent
	cancel()
	if err := <-quit; !errors.Is(err, ErrUnknown) {
		t.Fatalf("quitter: %v, want ErrUnknown", err)
	}
	if quitter.sealed != "0/2" && quitter.sealed != "1/2" {
		t.Fatalf("quitter sealed %q, want its place in the batch of 2", quitter.sealed)
	}
	close(release)
	if err := <-leadDone; err != nil {
		t.Fatal(err)
	}
	if err := <-otherDone; err != nil {
		t.Fatal(err)
	}
	if lead.sealed != "0/1" || len(sealed) != 2 {
		t.Fatalf("lead sealed %q, %d seals; want 0/1 and 2", lead.sealed, len(sealed))
	}
}

// TestCorkHoldsALoneJobOfABusyPartition: with a Cork, a job for a
// partition whose previous send just returned waits for company, and goes
// with it as one batch once full; a partition's first job (no send
// before: a quiet spell) goes at once, alone. Without the Cork the second
// job would go alone at once, and the third in a send of its own.
func TestCorkHoldsALoneJobOfABusyPartition(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{MaxCount: 2, Cork: time.Hour})
	first, r1 := start(t, s, b, 0) // quiet partition: at once, alone
	if !reflect.DeepEqual(first.jobs, []int{1}) {
		t.Fatalf("first batch %v, want [1]", first.jobs)
	}
	first.echo()
	if got := get(t, r1); got.v != 10 {
		t.Fatalf("job 1: %+v", got)
	}
	returned(t, b, 0)
	r2 := do(context.Background(), b, 0, 2) // busy now: corked
	queued(t, b, 0, 1)
	s.none(t)
	r3 := do(context.Background(), b, 0, 3) // full: both go
	c := s.next(t)
	if !reflect.DeepEqual(c.jobs, []int{2, 3}) {
		t.Fatalf("batch %v, want [2 3] as one", c.jobs)
	}
	c.echo()
	for _, r := range []<-chan result{r2, r3} {
		if got := get(t, r); got.v != 10*got.job || got.err != nil {
			t.Fatalf("outcome %+v", got)
		}
	}
}

// TestCorkSendsInTime: a corked job goes once the Cork is over, alone if
// nothing joined it.
func TestCorkSendsInTime(t *testing.T) {
	s := newSender()
	b := newBatcher(t, s, Config[int, int]{MaxCount: 3, Cork: time.Millisecond})
	first, _ := start(t, s, b, 0)
	first.echo()
	returned(t, b, 0)
	r := do(context.Background(), b, 0, 2)
	c := s.next(t)
	if !reflect.DeepEqual(c.jobs, []int{2}) {
		t.Fatalf("batch %v, want [2]", c.jobs)
	}
	c.echo()
	if got := get(t, r); got.v != 20 {
		t.Fatalf("job 2: %+v", got)
	}
}

// returned waits until partition part's send has returned (nothing in
// flight).
func returned(t *testing.T, b *Batcher[int, int], part int) {
	t.Helper()
	testwait.Eventually(t, wait, "the send returned", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return !b.parts[part].inflight
	})
}

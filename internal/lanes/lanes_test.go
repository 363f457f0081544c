package lanes

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// task is a job as the tests queue it: a one-job message of key at seq.
type task struct {
	key      string
	pos      Position
	part     bool
	maybeDup bool
	mark     Mark
}

func (t *task) Pos() Position        { return t.pos }
func (t *task) Key() string          { return t.key }
func (t *task) Part() bool           { return t.part }
func (t *task) MaybeDup() bool       { return t.maybeDup }
func (t *task) SetMaybeDup(dup bool) { t.maybeDup = dup }
func (t *task) Mark() *Mark          { return &t.mark }

func newTask(key string, seq uint64) *task {
	return &task{key: key, pos: Position{Seq: seq}}
}

// newLanes is New as the tests call it.
func newLanes(runners, group, window int, run func([]*task)) *Lanes[*task] {
	return New(Config[*task]{Runners: runners, Group: group, Window: window, Run: run})
}

// TestLanesOneAtATimeInOrder feeds interleaved jobs of a few keys and checks
// that each key ran one job at a time, in order, while different keys ran
// in parallel.
func TestLanesOneAtATimeInOrder(t *testing.T) {
	const keys, perKey = 6, 200
	var mu sync.Mutex
	running := map[string]int{}
	last := map[string]uint64{}
	maxPerKey, maxTotal, total := 0, 0, 0
	var order atomic.Int64
	l := newLanes(4, 1, 1<<20, one(func(tk *task) {
		mu.Lock()
		running[tk.key]++
		total++
		maxPerKey = max(maxPerKey, running[tk.key])
		maxTotal = max(maxTotal, total)
		if tk.pos.Seq <= last[tk.key] {
			order.Add(1)
		}
		last[tk.key] = tk.pos.Seq
		mu.Unlock()
		time.Sleep(50 * time.Microsecond)
		mu.Lock()
		running[tk.key]--
		total--
		mu.Unlock()
	}))
	seq := uint64(0)
	for i := 0; i < perKey; i++ {
		for k := 0; k < keys; k++ {
			seq++
			if ok, _ := l.Add(newTask(fmt.Sprintf("k%d", k), seq)); !ok {
				t.Fatalf("add refused seq %d", seq)
			}
		}
	}
	l.Close(false)
	if maxPerKey != 1 {
		t.Fatalf("max concurrent runs of one key = %d, want 1", maxPerKey)
	}
	if maxTotal < 2 {
		t.Fatalf("different keys never ran in parallel (max %d)", maxTotal)
	}
	if maxTotal > 4 {
		t.Fatalf("%d runs at once with 4 runners", maxTotal)
	}
	if n := order.Load(); n != 0 {
		t.Fatalf("%d runs out of order", n)
	}
	if l.Pending() != 0 {
		t.Fatalf("%d tasks left in flight", l.Pending())
	}
}

// TestLanesHotKeyDoesNotStarve checks that with one runner a hot key with a
// long queue yields to a cold key after a burst.
func TestLanesHotKeyDoesNotStarve(t *testing.T) {
	var mu sync.Mutex
	var ran []string
	gate := make(chan struct{})
	l := newLanes(1, 1, 1<<20, one(func(tk *task) {
		<-gate
		mu.Lock()
		ran = append(ran, tk.key)
		mu.Unlock()
	}))
	for i := 1; i <= 200; i++ {
		l.Add(newTask("hot", uint64(i)))
	}
	l.Add(newTask("cold", 1000))
	close(gate)
	l.Close(false)
	for i, k := range ran {
		if k == "cold" {
			if i > laneBurst+1 {
				t.Fatalf("cold key ran at position %d, after more than one burst of the hot key", i)
			}
			return
		}
	}
	t.Fatal("cold key never ran")
}

func TestLanesRefuseDuplicateInFlight(t *testing.T) {
	block := make(chan struct{})
	var runs atomic.Int64
	l := newLanes(2, 1, 1<<20, one(func(*task) { runs.Add(1); <-block }))
	if ok, _ := l.Add(newTask("a", 7)); !ok {
		t.Fatal("first add refused")
	}
	if ok, _ := l.Add(newTask("a", 7)); ok {
		t.Fatal("a redelivery of an in-flight sequence was queued")
	}
	close(block)
	l.Close(false)
	if runs.Load() != 1 {
		t.Fatalf("runs = %d, want 1", runs.Load())
	}
}

func TestLanesCloseDropsQueued(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	var runs atomic.Int64
	l := newLanes(1, 1, 1<<20, one(func(*task) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
	}))
	for i := 1; i <= 10; i++ {
		l.Add(newTask("a", uint64(i)))
	}
	<-started
	closed := make(chan struct{})
	go func() { l.Close(true); close(closed) }()
	// Let the running job finish only once close has marked the lanes
	// dropping, so the queued ones must be dropped, not run.
	for {
		l.mu.Lock()
		dropping := l.dropping
		l.mu.Unlock()
		if dropping {
			break
		}
		runtime.Gosched()
	}
	close(release)
	<-closed
	if runs.Load() != 1 {
		t.Fatalf("runs = %d after a dropping close, want only the running one", runs.Load())
	}
	if ok, _ := l.Add(newTask("a", 99)); ok {
		t.Fatal("add after close accepted")
	}
}

func one(fn func(*task)) func([]*task) {
	return func(ts []*task) {
		if len(ts) != 1 {
			panic(fmt.Sprintf("got %d tasks with group 1", len(ts)))
		}
		fn(ts[0])
	}
}

// TestLanesGroups checks that with a group size a runner gets several
// queued jobs of one key at once, in order, never more than the group and
// never two keys mixed, and that every job runs exactly once.
func TestLanesGroups(t *testing.T) {
	const keys, perKey, group = 3, 300, 16
	var mu sync.Mutex
	seen := map[uint64]int{}
	last := map[string]uint64{}
	biggest, bad := 0, ""
	gate := make(chan struct{})
	l := newLanes(2, group, 1<<20, func(ts []*task) {
		<-gate
		mu.Lock()
		defer mu.Unlock()
		biggest = max(biggest, len(ts))
		if len(ts) > group {
			bad = fmt.Sprintf("group of %d", len(ts))
		}
		for _, tk := range ts {
			if tk.key != ts[0].key {
				bad = "keys mixed in one group"
			}
			if tk.pos.Seq <= last[tk.key] {
				bad = fmt.Sprintf("key %s: seq %d after %d", tk.key, tk.pos.Seq, last[tk.key])
			}
			last[tk.key] = tk.pos.Seq
			seen[tk.pos.Seq]++
		}
	})
	seq := uint64(0)
	for i := 0; i < perKey; i++ {
		for k := 0; k < keys; k++ {
			seq++
			l.Add(newTask(fmt.Sprintf("k%d", k), seq))
		}
	}
	close(gate)
	l.Close(false)
	if bad != "" {
		t.Fatal(bad)
	}
	if biggest < 2 {
		t.Fatalf("largest group %d: queued jobs were never grouped", biggest)
	}
	if len(seen) != keys*perKey {
		t.Fatalf("%d jobs ran, want %d", len(seen), keys*perKey)
	}
	for s, n := range seen {
		if n != 1 {
			t.Fatalf("seq %d ran %d times", s, n)
		}
	}
}

// TestLanesGapClosesWhateverTheReturnOrder: a stalled key hands jobs back;
// once its head settled, they come back in any order (a cluster returns
// them in interleaved clumps) while new jobs of the key keep arriving.
// Every one is taken, none is handed back again, and the key's jobs run in
// stream order.
func TestLanesGapClosesWhateverTheReturnOrder(t *testing.T) {
	var mu sync.Mutex
	var ran []uint64
	gate := make(chan struct{})
	l := newLanes(2, 1, 64, one(func(tk *task) {
		if tk.pos.Seq == 1 {
			<-gate
		}
		mu.Lock()
		ran = append(ran, tk.pos.Seq)
		mu.Unlock()
	}))
	for seq := uint64(1); seq <= 40; seq++ {
		l.Add(newTask("hot", seq))
	}
	for !runningHead(l, "hot") {
		runtime.Gosched()
	}
	back := l.Stall("hot", true) // seq 1 runs and "fails"; it keeps 16 queued
	if len(back) != 40-1-16 {
		t.Fatalf("stall handed back %d jobs, want %d", len(back), 40-1-16)
	}
	if ok, hb := l.Add(newTask("hot", 41)); !ok || !hb {
		t.Fatalf("a new job of the stalled key: ok %v handBack %v, want handed back", ok, hb)
	}
	l.Stall("hot", false) // the head settled
	close(gate)
	for seq := uint64(42); seq <= 50; seq++ { // the key's traffic goes on
		if ok, hb := l.Add(newTask("hot", seq)); !ok || hb {
			t.Fatalf("new job %d after the head settled: ok %v handBack %v", seq, ok, hb)
		}
	}
	// They come back highest first, 41 last.
	for i := len(back) - 1; i >= 0; i-- {
		if ok, hb := l.Add(newTask("hot", back[i].pos.Seq)); !ok || hb {
			t.Fatalf("returning job %d: ok %v handBack %v, want taken", back[i].pos.Seq, ok, hb)
		}
	}
	if n := l.HandedBack(); n != 1 {
		t.Fatalf("%d jobs handed back before 41 returned, want 1", n)
	}
	if ok, hb := l.Add(newTask("hot", 41)); !ok || hb {
		t.Fatalf("returning job 41: ok %v handBack %v", ok, hb)
	}
	l.Close(false)
	if !slices.IsSorted(ran) || len(ran) != 50 {
		t.Fatalf("ran %d jobs, sorted %v: %v", len(ran), slices.IsSorted(ran), ran)
	}
	if n := l.HandedBack(); n != 0 {
		t.Fatalf("%d jobs still handed back", n)
	}
}

// runningHead reports whether key's lane has a job taken by a runner.
func runningHead(l *Lanes[*task], key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.busy > 0 && l.byKey[key] != nil
}

// TestLanesWindowBehindAGapHandsBackTheHighest: jobs waiting behind a
// key's gap fill the window while no runner has work. waitRoom must hand
// back the highest of them instead of waiting for ever: the job that
// closes the gap has to be delivered.
func TestLanesWindowBehindAGapHandsBackTheHighest(t *testing.T) {
	l := newLanes(1, 1, 4, one(func(*task) {}))
	defer l.Close(true)
	l.mu.Lock()
	l.byKey["k"] = &lane[*task]{key: "k", handedBack: gap{{seq: 5}}} // 5 is out
	l.mu.Unlock()
	for seq := uint64(6); seq <= 9; seq++ {
		if ok, hb := l.Add(newTask("k", seq)); !ok || hb {
			t.Fatalf("job %d behind the gap: ok %v handBack %v", seq, ok, hb)
		}
	}
	back, _ := l.WaitRoom()
	if len(back) != 1 || back[0].pos.Seq != 9 {
		t.Fatalf("waitRoom on a window full behind a gap handed back %d jobs (%v), want 9", len(back), back)
	}
	if l.Pending() != 3 || l.HandedBack() != 2 {
		t.Fatalf("pending %d, handed back %d; want 3 and 2", l.Pending(), l.HandedBack())
	}
}

// TestLanesStalledKeysGiveTheirKeptJobsBack: two stalled keys keep
// their queued jobs (keep 2 each on a window of 4) and so fill the
// window while no runner has other work. waitRoom must hand back one of
// the kept jobs instead of waiting for a head to settle, and the key that
// gave it up must not take it back while its head still fails; once the
// heads settled every job runs, each key in order.
func TestLanesStalledKeysGiveTheirKeptJobsBack(t *testing.T) {
	var mu sync.Mutex
	ran := map[string][]uint64{}
	gate := make(chan struct{})
	l := newLanes(2, 1, 4, one(func(tk *task) {
		if tk.pos.Seq == 1 || tk.pos.Seq == 4 {
			<-gate
		}
		mu.Lock()
		ran[tk.key] = append(ran[tk.key], tk.pos.Seq)
		mu.Unlock()
	}))
	for seq := uint64(1); seq <= 6; seq++ {
		l.Add(newTask(map[bool]string{true: "a", false: "b"}[seq <= 3], seq))
	}
	for {
		l.mu.Lock()
		b := l.busy
		l.mu.Unlock()
		if b == 2 {
			break
		}
		runtime.Gosched()
	}
	if back := append(l.Stall("a", true), l.Stall("b", true)...); len(back) != 0 {
		t.Fatalf("stall handed back %d jobs, want none (each keeps 2)", len(back))
	}
	back, stalledBack := l.WaitRoom()
	if len(back) != 0 || len(stalledBack) != 1 {
		t.Fatalf("waitRoom on a window full of kept jobs handed back %d and %d kept ones, want 0 and 1", len(back), len(stalledBack))
	}
	got := stalledBack[0]
	if got.pos.Seq != 3 && got.pos.Seq != 6 {
		t.Fatalf("handed back job %d, want a key's highest (3 or 6)", got.pos.Seq)
	}
	if ok, hb := l.Add(newTask(got.key, got.pos.Seq)); !ok || !hb {
		t.Fatalf("the squeezed key took its job %d back while stalled: ok %v handBack %v", got.pos.Seq, ok, hb)
	}
	l.Stall("a", false)
	l.Stall("b", false)
	close(gate)
	if ok, hb := l.Add(newTask(got.key, got.pos.Seq)); !ok || hb {
		t.Fatalf("returning job %d after the heads settled: ok %v handBack %v", got.pos.Seq, ok, hb)
	}
	l.Close(false)
	if !slices.Equal(ran["a"], []uint64{1, 2, 3}) || !slices.Equal(ran["b"], []uint64{4, 5, 6}) {
		t.Fatalf("ran %v", ran)
	}
	if n := l.HandedBack(); n != 0 {
		t.Fatalf("%d jobs still handed back", n)
	}
}

// TestLanesPausedRunnerLetsOthersRun: with one runner, a job waiting out
// a retry's backoff (pause) must not hold the lanes: another key's job
// runs meanwhile, and once the pause ended the lanes are back to one
// runner.
func TestLanesPausedRunnerLetsOthersRun(t *testing.T) {
	var l *Lanes[*task]
	other := make(chan struct{})
	var paused atomic.Bool
	l = newLanes(1, 1, 64, one(func(tk *task) {
		if tk.key == "failing" {
			// Its backoff lasts until the other key ran (or a minute).
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-other:
				case <-time.After(time.Minute):
				}
				cancel()
			}()
			paused.Store(true)
			l.Pause(ctx, time.Hour)
			return
		}
		close(other)
	}))
	l.Add(newTask("failing", 1))
	for !paused.Load() {
		runtime.Gosched()
	}
	l.Add(newTask("other", 2))
	select {
	case <-other:
	case <-time.After(time.Minute):
		t.Fatal("another key did not run while the only runner paused")
	}
	l.Close(false)
	if l.live != 0 {
		t.Fatalf("%d runners left after close", l.live)
	}
}

// TestLanesDroppingCloseEndsABackoff: a re-sync closes the lanes dropping
// their jobs and waits for the runners. A job waiting out a retry's
// backoff must give up at once (its new consumer delivers it again), not
// hold the re-sync, and with it the partition, until it settles.
func TestLanesDroppingCloseEndsABackoff(t *testing.T) {
	var l *Lanes[*task]
	paused := make(chan bool, 1)
	l = newLanes(1, 1, 64, one(func(*task) {
		paused <- l.Pause(context.Background(), time.Hour)
	}))
	l.Add(newTask("failing", 1))
	for {
		l.mu.Lock()
		p := l.pausing
		l.mu.Unlock()
		if p == 1 {
			break
		}
		runtime.Gosched()
	}
	closed := make(chan struct{})
	go func() { l.Close(true); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("a dropping close waited for a job's backoff")
	}
	if <-paused {
		t.Fatal("pause reported its backoff waited out")
	}
}

// TestLanesBatchPartsCountInTheWindow: the window bounds the jobs held
// whatever message they came in: four jobs of a batch of a healthy key
// fill a window of 4, and WaitRoom waits until one of them ran, letting
// nothing in over the window while a runner can still free a place.
func TestLanesBatchPartsCountInTheWindow(t *testing.T) {
	gate := make(chan struct{})
	l := newLanes(1, 1, 4, one(func(tk *task) { <-gate }))
	for i := range 4 {
		l.Add(&task{key: "c", pos: Position{Seq: 10, Index: i}, part: true})
	}
	returned := make(chan struct{})
	go func() {
		back, stalledBack := l.WaitRoom()
		if len(back)+len(stalledBack) != 0 {
			t.Errorf("WaitRoom handed back %d jobs of a batch", len(back)+len(stalledBack))
		}
		close(returned)
	}()
	select {
	case <-returned:
		t.Fatal("WaitRoom returned with a full window of a batch's jobs, one of them running")
	case <-time.After(200 * time.Millisecond):
	}
	close(gate)
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("WaitRoom still waits after the batch's jobs ran")
	}
	l.Close(false)
	if n := l.Overflow(); n != 0 {
		t.Fatalf("%d messages let in over the window while a runner could free a place", n)
	}
}

// TestLanesWindowOfBatchPartsLetsTheNextIn: two keys stall, and jobs of
// a batch of several (which cannot be handed back alone) of theirs fill
// the window: WaitRoom must let the next message in (Overflow) rather
// than wait for a failing head to settle, or a healthy key's job would
// not be fetched (issue 28, bug 5); and that job then runs at once.
func TestLanesWindowOfBatchPartsLetsTheNextIn(t *testing.T) {
	// The heads wait out a backoff (Pause) until the gate opens, as a
	// failing job does between its attempts.
	ctx, release := context.WithCancel(context.Background())
	defer release()
	ran := make(chan string, 16)
	var l *Lanes[*task]
	l = newLanes(2, 1, 4, one(func(tk *task) {
		if tk.key == "a" && tk.pos.Seq == 1 || tk.key == "b" && tk.pos.Seq == 2 {
			l.Pause(ctx, time.Hour)
		}
		ran <- fmt.Sprintf("%s%d.%d", tk.key, tk.pos.Seq, tk.pos.Index)
	}))
	l.Add(newTask("a", 1))
	l.Add(newTask("b", 2))
	for {
		l.mu.Lock()
		b := l.busy
		l.mu.Unlock()
		if b == 2 {
			break
		}
		runtime.Gosched()
	}
	l.Stall("a", true)
	l.Stall("b", true)
	for i := range 5 {
		l.Add(&task{key: map[bool]string{true: "a", false: "b"}[i < 3], pos: Position{Seq: 3, Index: i}, part: true})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if back, stalledBack := l.WaitRoom(); len(back)+len(stalledBack) != 0 {
			t.Errorf("WaitRoom handed back %d jobs of a batch", len(back)+len(stalledBack))
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("WaitRoom waits on a window held by failing keys' batch jobs")
	}
	if n := l.Overflow(); n != 1 {
		t.Fatalf("Overflow = %d, want 1", n)
	}
	l.Add(newTask("healthy", 4))
	select {
	case got := <-ran:
		if got != "healthy4.0" {
			t.Fatalf("ran %s first, want the healthy key's job", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the healthy key's job did not run while the two keys fail")
	}
	l.Stall("a", false)
	l.Stall("b", false)
	release()
	l.Close(false)
	if len(ran) != 7 {
		t.Fatalf("%d more jobs ran, want the 7 of the failing keys", len(ran))
	}
}

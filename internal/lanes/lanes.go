package lanes

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"
)

// Task is what the lanes queue: one fetched job. Its position and key
// never change while it is in the lanes.
type Task interface {
	// Pos is the job's position in its partition.
	Pos() Position
	// Key is the job's resource key: its lane.
	Key() string
	// Part reports whether the job is one of a batch message of several
	// jobs. Such a job is never handed back (the message cannot be
	// half-acked or half-NAKed), so a lane's gap holds only jobs that came
	// alone (a batch of one), by sequence. It counts in the window as any
	// job does; when the window is full of jobs that can neither run nor
	// be handed back, WaitRoom lets the next message in (see WaitRoom).
	Part() bool
	// MaybeDup reports whether the job may have run before under an
	// earlier owner; SetMaybeDup sets it. A job handed back keeps the
	// value it had when it was handed back when it returns: its
	// redelivery was the lanes', not a crash's.
	MaybeDup() bool
	SetMaybeDup(bool)
	// Mark is the lanes' own record on the task, which only the lanes
	// write.
	Mark() *Mark
}

// Mark is what the lanes note on a task while it is in flight: when they
// last reported its progress (Touch), and whether the runner that took
// it put it back (Requeue). Its zero value is a task never added.
type Mark struct {
	progress time.Time
	requeued bool // put back in its lane by the runner that took it
}

// Requeued reports whether the runner running the task put it back in
// its lane (Requeue) instead of settling it. Only that runner may ask,
// while Run has the task.
func (m *Mark) Requeued() bool { return m.requeued }

// Position names a fetched job in its partition: its stream sequence and
// its index in a batch message (0 for a one-job message); jobs of one
// batch share the sequence.
type Position struct {
	Seq   uint64
	Index int
}

// before orders jobs as they were stored: by sequence, then in the batch.
func (p Position) before(q Position) bool {
	return p.Seq < q.Seq || p.Seq == q.Seq && p.Index < q.Index
}

// lane holds the queued jobs of one key, in stream order.
//
// While the key's head job fails and retries (stalled), the lane keeps at
// most keep queued jobs (see Lanes.keep); the others are handed back to
// the server (the caller NAKs them with a delay) so they do not hold the
// partition's in-flight window, and so do the key's arrivals while it is
// stalled. The jobs handed back and not yet returned (handedBack) are a
// gap in the lane: only queued jobs below the lowest of them run, so the
// key's order holds. Once the head settled, every returning job is taken,
// whatever its order, and new arrivals wait in the lane behind the gap
// instead of being handed back: nothing is handed back any more (unless
// the window is full, see Lanes.WaitRoom), so the gap closes as soon as
// the server has returned what was handed back, within the longest NAK
// delay, while the key's traffic keeps arriving. A lane with jobs handed
// back stays registered even when its queue is empty, so a later job
// cannot overtake them.
//
// A stalled lane keeps its queued jobs only while the window has room for
// other keys: when it is full and nothing else makes room, WaitRoom hands
// kept jobs back too (evict), and the lane so squeezed keeps no more
// until its head settled.
type lane[T Task] struct {
	key        string
	queue      []T // by stream sequence
	head       int
	active     bool // in the ready list or held by a runner
	stalled    bool // its head job is retrying
	squeezed   bool // stalled, and gave up kept jobs for room: it keeps none
	handedBack gap  // its jobs handed back and not returned yet
}

// gap is a lane's jobs handed back and not returned yet, by sequence,
// each with its maybeDup as it was handed back.
type gap []gapJob

type gapJob struct {
	seq      uint64
	maybeDup bool
}

func (g gap) find(seq uint64) (int, bool) {
	i := sort.Search(len(g), func(i int) bool { return g[i].seq >= seq })
	return i, i < len(g) && g[i].seq == seq
}

// has reports whether seq is in the gap, and its maybeDup.
func (g gap) has(seq uint64) (maybeDup, ok bool) {
	i, ok := g.find(seq)
	return ok && g[i].maybeDup, ok
}

func (g *gap) add(seq uint64, maybeDup bool) {
	if i, ok := g.find(seq); !ok {
		*g = slices.Insert(*g, i, gapJob{seq, maybeDup})
	}
}

func (g *gap) remove(seq uint64) {
	if i, ok := g.find(seq); ok {
		*g = slices.Delete(*g, i, i+1)
	}
}

// lowest is the gap's lowest sequence, 0 when it is empty.
func (g gap) lowest() uint64 {
	if len(g) == 0 {
		return 0
	}
	return g[0].seq
}

// stalledKeep is the most queued jobs a stalled key keeps in memory.
const stalledKeep = 16

func (ln *lane[T]) queued() int { return len(ln.queue) - ln.head }

// runnable returns how many queued jobs, from the head, lie below the
// lane's gap (all of them when nothing is handed back).
func (ln *lane[T]) runnable() int {
	if len(ln.handedBack) == 0 {
		return ln.queued()
	}
	low := ln.handedBack.lowest()
	q := ln.queue[ln.head:]
	return sort.Search(len(q), func(i int) bool { return q[i].Pos().Seq > low })
}

// insert queues t in sequence order: behind the others, unless it is a
// handed-back job that came back after later ones arrived.
func (ln *lane[T]) insert(t T) {
	q := ln.queue[ln.head:]
	i := sort.Search(len(q), func(i int) bool { return t.Pos().before(q[i].Pos()) })
	ln.queue = slices.Insert(ln.queue, ln.head+i, t)
}

// Lanes runs the jobs of one partition: one key's jobs at a time, in the
// order they were fetched, and different keys on up to `runners` goroutines.
// A fixed pool of runners takes ready lanes; no goroutine is started per job.
// A runner takes up to `group` queued jobs of its lane at once (for group
// commit) and runs them in order.
//
// The lanes hold at most `window` fetched jobs (MaxInFlight), whatever
// message they came in, not counting the head job of each stalled key:
// that one retries in its runner (one per stalled key; the server's window
// bounds them), and a failing key never fills the window alone, whatever
// its size. A stalled key keeps at most keep = min(stalledKeep, window/2)
// queued jobs that came alone, and only while the window has room: when
// it is full and no other job can free a place, stalled keys' kept jobs
// are handed back (WaitRoom), so however many keys stall, the other keys'
// jobs are still fetched. A job of a batch of several cannot be handed
// back: when only such jobs hold a full window, waiting on failing keys
// (stalled, or behind a gap), WaitRoom lets the next message in rather
// than wait for a failing key's head to settle (Overflow counts it).
//
// At most `runners` runners hold a place (run jobs, or wait for a lane)
// at once: one waiting out a backoff gives its place up (Pause), and
// takes one again before it goes on, so the handler never runs more than
// `runners` jobs at once.
//
// Its methods are safe for concurrent use; New makes one.
type Lanes[T Task] struct {
	mu       sync.Mutex
	cond     *sync.Cond
	byKey    map[string]*lane[T]
	ready    []*lane[T]
	inflight map[Position]T // every fetched, unfinished job
	overflow int            // messages let in over a full window (WaitRoom)
	closed   bool           // no more tasks will be added
	dropping bool           // drop queued tasks instead of running them
	group    int            // most tasks handed to run at once
	window   int            // most fetched jobs held, stalled heads aside
	keep     int            // most queued jobs a stalled key keeps
	stalled  int            // lanes whose head job is retrying
	busy     int            // runners running tasks
	runners  int            // runners wanted, not counting those pausing
	live     int            // runner goroutines
	pausing  int            // runners waiting out a retry's backoff
	resuming int            // runners back from a backoff, waiting for a place
	run      func([]T)      // runs a lane's tasks
	woken    bool           // WaitRoom returns at once
	dropped  chan struct{}  // closed when Close drops the queued jobs
	room     *sync.Cond     // signalled when in-flight jobs finish
	place    *sync.Cond     // signalled when a runner gives its place up
	wg       sync.WaitGroup
}

// fairness: a runner hands a busy lane back after this many runs (of one
// job, or one group) when other lanes are waiting, so one hot key cannot
// starve the rest.
const laneBurst = 32

// Config is what New builds the lanes of one partition from.
type Config[T Task] struct {
	// Runners is how many goroutines run the lanes (the worker's
	// Concurrency): the most jobs running at once.
	Runners int
	// Group is the most queued jobs of one key handed to Run at once
	// (group commit). Defaults to 1.
	Group int
	// Window is the most fetched jobs the lanes hold, whatever message
	// they came in, the stalled keys' head jobs aside (MaxInFlight); see
	// WaitRoom for the one way past it. Defaults to 1.
	Window int
	// Run runs tasks of one key, in order. The lanes call it from their
	// runners only, never for two tasks of one key at once.
	Run func([]T)
}

// New returns the lanes of one partition with their runners started.
// Close stops them.
func New[T Task](cfg Config[T]) *Lanes[T] {
	runners, group, window, run := cfg.Runners, cfg.Group, cfg.Window, cfg.Run
	window = max(window, 1)
	l := &Lanes[T]{byKey: map[string]*lane[T]{}, inflight: map[Position]T{}, group: max(group, 1), window: window, keep: min(stalledKeep, window/2),
		runners: runners, live: runners, run: run, dropped: make(chan struct{})}
	l.cond = sync.NewCond(&l.mu)
	l.room = sync.NewCond(&l.mu)
	l.place = sync.NewCond(&l.mu)
	l.wg.Add(runners)
	for i := 0; i < runners; i++ {
		go l.runner()
	}
	return l
}

// Pause waits out a retry's backoff (d; it reports false if ctx ends or
// the lanes are closed dropping their jobs first, a re-synchronisation
// that must not wait for a failing job to settle) for the runner calling
// it, without holding that runner's place:
// while it waits, another runner starts if a lane is ready, so keys whose
// head jobs retry do not hold the partition's runners, whatever
// Concurrency is. Once the backoff is over it waits for a place again:
// for fewer than l.runners runners holding one. The runners beyond that
// give theirs up between two jobs (next) or while idle, so heads coming
// back from their backoffs together never run more than l.runners jobs
// at once.
func (l *Lanes[T]) Pause(ctx context.Context, d time.Duration) bool {
	l.mu.Lock()
	l.pausing++
	l.spare()
	l.place.Broadcast()
	l.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	waited := false
	select {
	case <-t.C:
		waited = true
	case <-ctx.Done():
	case <-l.dropped:
	}
	stop := context.AfterFunc(ctx, func() {
		l.mu.Lock()
		l.place.Broadcast()
		l.mu.Unlock()
	})
	defer stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pausing--
	if !waited {
		return false // it runs no job more: no place needed
	}
	l.resuming++
	l.cond.Broadcast() // an idle runner beyond the wanted number exits
	for l.live-l.pausing-l.resuming >= l.runners && !l.dropping && ctx.Err() == nil {
		l.place.Wait()
	}
	l.resuming--
	return !l.dropping && ctx.Err() == nil
}

// spare starts a runner when a lane is ready and fewer than l.runners
// runners are not pausing. It runs with l.mu held, by a runner or while
// the lanes are open, so the runners' WaitGroup is never at zero here.
func (l *Lanes[T]) spare() {
	if len(l.ready) > 0 && l.live-l.pausing < l.runners {
		l.live++
		l.wg.Add(1)
		go l.runner()
	}
}

// Add queues t behind the earlier jobs of its key. It reports false for a
// job already in flight here (a redelivery racing the original), which the
// caller drops: the original's ack covers it. It reports handBack for a
// job of a stalled key the lane does not keep: the caller NAKs it with a
// delay, and the lane takes it when it comes back.
func (l *Lanes[T]) Add(t T) (ok, handBack bool) {
	ok, handBack, _ = l.AddTo(t)
	return ok, handBack
}

// AddTo is Add, also telling whether the job's key is stalled.
func (l *Lanes[T]) AddTo(t T) (ok, handBack, stalled bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false, false, false
	}
	if _, dup := l.inflight[t.Pos()]; dup {
		return false, false, false
	}
	ln := l.byKey[t.Key()]
	if ln != nil {
		wasDup, back := ln.handedBack.has(t.Pos().Seq)
		if ln.stalled && !t.Part() {
			// Keep only a job that goes right after the kept ones, and
			// only up to keep; the rest wait on the server.
			if ln.squeezed || ln.queued() >= l.keep || ln.handedBack.lowest() != 0 && t.Pos().Seq != ln.handedBack.lowest() {
				if !back {
					ln.handedBack.add(t.Pos().Seq, t.MaybeDup())
				}
				return true, true, true
			}
		}
		// Not stalled: every job is taken, a returning one in its place,
		// a later one behind the gap.
		if back {
			ln.handedBack.remove(t.Pos().Seq)
			t.SetMaybeDup(wasDup) // its redelivery was ours, not a crash's
		}
	}
	t.Mark().progress = time.Now()
	l.inflight[t.Pos()] = t
	if ln == nil {
		ln = &lane[T]{key: t.Key()}
		l.byKey[t.Key()] = ln
	}
	ln.insert(t)
	if !ln.active && ln.runnable() > 0 {
		ln.active = true
		l.ready = append(l.ready, ln)
		l.cond.Signal()
		l.spare()
	}
	return true, false, false
}

// Stall marks key's lane as retrying its head job (or not) and returns the
// queued jobs beyond keep, and any behind the lane's gap, which the caller
// hands back to the server; they are no longer in flight here.
func (l *Lanes[T]) Stall(key string, stalled bool) []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln := l.byKey[key]
	if ln == nil || ln.stalled == stalled {
		return nil
	}
	ln.stalled = stalled
	if !stalled {
		l.stalled--
		ln.squeezed = false
		return nil
	}
	l.stalled++ // its head leaves the window
	l.room.Broadcast()
	cut := ln.head + min(ln.runnable(), l.keep)
	if cut == len(ln.queue) {
		return nil
	}
	var back []T
	kept := ln.queue[:cut]
	for _, t := range ln.queue[cut:] {
		if t.Part() {
			kept = append(kept, t) // never handed back: it waits behind the gap
			continue
		}
		back = append(back, t)
	}
	clear(ln.queue[len(kept):])
	ln.queue = kept
	for _, t := range back {
		l.forget(t)
		ln.handedBack.add(t.Pos().Seq, t.MaybeDup())
	}
	return back
}

// WaitRoom blocks while the lanes hold a full window of fetched jobs,
// until Wake or Close. When nothing can make room (no runner runs a job
// that is not a stalled head, no lane is ready), it takes a job out
// instead and returns it for the caller to hand back: the highest job
// waiting behind a lane's gap (back), as the jobs that close the gaps
// must still be delivered; else the highest job a stalled key keeps
// (stalledBack), as other keys' jobs must still be fetched however many
// keys stall. When no such job is left either, the window is held by
// jobs of batch messages of several jobs waiting on failing keys (a
// stalled key's, or queued behind a gap), which cannot be handed back
// alone: it returns, letting one more message in over the window
// (Overflow), as the jobs that close the gaps and the other keys' jobs
// must still be fetched. So the window bounds the jobs held but for
// those: the server's window (MaxPending) bounds their messages.
func (l *Lanes[T]) WaitRoom() (back, stalledBack []T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.inflight)-l.stalled >= l.window && !l.closed && !l.woken {
		if len(l.ready) == 0 && l.busy <= l.stalled {
			if t, ok := l.evict(); ok {
				back = append(back, t)
				continue
			}
			if t, ok := l.evictKept(); ok {
				stalledBack = append(stalledBack, t)
				continue
			}
			if !l.running() {
				l.overflow++
				break
			}
		}
		l.room.Wait()
	}
	return back, stalledBack
}

// running reports whether a lane that is not stalled is held by a runner
// between two of its takes (active, not ready): it will run or retire, and
// free a place or let a WaitRoom decide again.
func (l *Lanes[T]) running() bool {
	for _, ln := range l.byKey {
		if ln.active && !ln.stalled {
			return true
		}
	}
	return false
}

// Overflow returns how many times WaitRoom let a message in over a full
// window held by jobs that could neither run nor be handed back.
func (l *Lanes[T]) Overflow() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overflow
}

// evict takes the highest queued job waiting behind a lane's gap out of
// the lanes, as handed back, or reports false when no job waits so.
func (l *Lanes[T]) evict() (T, bool) {
	for _, ln := range l.byKey {
		if ln.stalled || len(ln.handedBack) == 0 || ln.runnable() == ln.queued() {
			continue
		}
		if t, ok := l.popLast(ln); ok {
			return t, true
		}
	}
	var none T
	return none, false
}

// evictKept takes the highest queued job of the stalled lane keeping the
// most jobs that can be handed back (those that came alone) out of the lanes,
// as handed back, and squeezes that lane: it keeps no returning job until
// its head settled, or its jobs would come back into the window only to
// be handed back again. It reports false when no stalled lane keeps such a
// job. Its head stays: it runs in its runner, out of the window. A lane
// keeping only jobs of batches of several is passed over: they cannot be
// handed back (WaitRoom lets the next message in instead); picking it by
// its queue's length handed nothing back and left the window full of the
// other stalled keys' jobs until a head settled.
func (l *Lanes[T]) evictKept() (T, bool) {
	var most *lane[T]
	mostN := 0
	for _, ln := range l.byKey {
		if !ln.stalled {
			continue
		}
		if n := ln.handable(); n > mostN {
			most, mostN = ln, n
		}
	}
	if most == nil {
		var none T
		return none, false
	}
	most.squeezed = true
	return l.popLast(most)
}

// handable is how many of ln's queued jobs can be handed back: those
// that came alone (not Part).
func (ln *lane[T]) handable() int {
	n := 0
	for _, t := range ln.queue[ln.head:] {
		if !t.Part() {
			n++
		}
	}
	return n
}

// popLast takes ln's last queued job that is not a batch's out of the
// lanes, as handed back; false when every queued job is a batch's.
func (l *Lanes[T]) popLast(ln *lane[T]) (T, bool) {
	last := len(ln.queue) - 1
	for last >= ln.head && ln.queue[last].Part() {
		last--
	}
	if last < ln.head {
		var none T
		return none, false
	}
	t := ln.queue[last]
	if last == len(ln.queue)-1 {
		clear(ln.queue[last:])
		ln.queue = ln.queue[:last]
	} else {
		ln.queue = slices.Delete(ln.queue, last, last+1)
	}
	l.forget(t)
	ln.handedBack.add(t.Pos().Seq, t.MaybeDup())
	return t, true
}

// forget takes t out of the in-flight jobs.
func (l *Lanes[T]) forget(t T) {
	if _, ok := l.inflight[t.Pos()]; !ok {
		return
	}
	delete(l.inflight, t.Pos())
}

// Wake ends every WaitRoom, now and later.
func (l *Lanes[T]) Wake() {
	l.mu.Lock()
	l.woken = true
	l.room.Broadcast()
	l.mu.Unlock()
}

func (l *Lanes[T]) runner() {
	defer l.wg.Done()
	buf := make([]T, 0, l.group)
	for {
		l.mu.Lock()
		for len(l.ready) == 0 && !l.closed && l.live-l.pausing <= l.runners {
			l.cond.Wait()
		}
		if len(l.ready) == 0 || l.live-l.pausing > l.runners {
			// Closed and drained, or one runner too many since a paused
			// one came back; a ready lane's wake-up goes to another.
			l.live--
			if len(l.ready) > 0 {
				l.cond.Signal()
			}
			l.place.Broadcast()
			l.mu.Unlock()
			return
		}
		ln := l.ready[0]
		l.ready[0] = nil
		l.ready = l.ready[1:]
		l.mu.Unlock()
		for n := 0; ; {
			ts := l.next(ln, n, buf[:0])
			if len(ts) == 0 {
				break
			}
			l.run(ts)
			l.done(ts)
			n++
			clear(ts)
		}
	}
}

// next pops ln's next tasks (at most l.group, none behind its gap) into
// buf; it retires ln when it has none to run, and hands ln back to the
// ready queue after a burst when other lanes wait, or when a runner back
// from a backoff needs this runner's place, returning no task in these
// cases. A runner holding tasks counts as busy until done.
func (l *Lanes[T]) next(ln *lane[T], n int, buf []T) []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropping {
		for _, t := range ln.queue[ln.head:] {
			l.forget(t)
		}
		ln.queue, ln.head = nil, 0
	}
	k := min(l.group, ln.runnable())
	if k == 0 {
		if ln.head == len(ln.queue) {
			ln.queue, ln.head = ln.queue[:0], 0
		}
		ln.active = false
		if ln.queued() == 0 && len(ln.handedBack) == 0 {
			delete(l.byKey, ln.key)
		}
		l.room.Broadcast() // a WaitRoom may now hand back what waits behind the gap
		return nil
	}
	if n >= laneBurst && len(l.ready) > 0 || l.live-l.pausing > l.runners {
		l.ready = append(l.ready, ln)
		l.cond.Signal()
		return nil
	}
	buf = append(buf, ln.queue[ln.head:ln.head+k]...)
	clear(ln.queue[ln.head : ln.head+k])
	ln.head += k
	if ln.head == len(ln.queue) {
		ln.queue, ln.head = ln.queue[:0], 0
	} else if ln.head > 64 && ln.head*2 > len(ln.queue) {
		ln.queue = append(ln.queue[:0:0], ln.queue[ln.head:]...)
		ln.head = 0
	}
	l.busy++
	return buf
}

func (l *Lanes[T]) done(ts []T) {
	l.mu.Lock()
	l.busy--
	for _, t := range ts {
		if t.Mark().requeued {
			t.Mark().requeued = false
			continue
		}
		l.forget(t)
	}
	l.room.Broadcast()
	l.mu.Unlock()
}

// Requeue puts tasks a runner took from key's lane but did not run back at
// the front of the lane, in order; they stay in flight, and the lane's next
// take (or a stall's hand-back) sees them again.
func (l *Lanes[T]) Requeue(key string, ts []T) {
	if len(ts) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ln := l.byKey[key]
	if ln == nil || l.dropping {
		return // dropped with the lanes: the next consumer delivers them again
	}
	q := make([]T, 0, len(ts)+ln.queued())
	for _, t := range ts {
		t.Mark().requeued = true
		q = append(q, t)
	}
	ln.queue = append(q, ln.queue[ln.head:]...)
	ln.head = 0
}

// Touch calls fn for every in-flight task whose last progress is older than
// age, and restarts its clock. Used to send InProgress for jobs that wait or
// run long, so the server does not redeliver them.
func (l *Lanes[T]) Touch(age time.Duration, fn func(T)) {
	now := time.Now()
	var due []T
	l.mu.Lock()
	for _, t := range l.inflight {
		if now.Sub(t.Mark().progress) >= age {
			t.Mark().progress = now
			due = append(due, t)
		}
	}
	l.mu.Unlock()
	for _, t := range due {
		fn(t)
	}
}

// HandedBack returns how many jobs the lanes handed back that have not
// come back yet.
func (l *Lanes[T]) HandedBack() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ln := range l.byKey {
		n += len(ln.handedBack)
	}
	return n
}

// Pending returns how many fetched jobs are not finished.
func (l *Lanes[T]) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.inflight)
}

// Close stops the runners once every queued job has run (drop=false), or
// once the running ones return, dropping the queued ones (drop=true). It
// waits for the runners to exit.
func (l *Lanes[T]) Close(drop bool) {
	l.mu.Lock()
	l.closed = true
	l.room.Broadcast()
	l.place.Broadcast()
	if drop {
		if !l.dropping {
			close(l.dropped)
		}
		l.dropping = true
		for _, ln := range l.byKey { // ready, held, or waiting behind a gap
			for _, t := range ln.queue[ln.head:] {
				l.forget(t)
			}
			ln.queue, ln.head = nil, 0
		}
	}
	l.cond.Broadcast()
	l.mu.Unlock()
	l.wg.Wait()
}

package keylane

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// task is one fetched job waiting in, or running from, its key's lane.
type task struct {
	msg jetstream.Msg
	job Job
	// batch is the batch message the job came in, nil for a one-job
	// message. A job of a batch is never handed back (the message cannot
	// be half-acked or half-NAKed: batchpart.go), so a lane's gap holds
	// one-job messages only, by sequence.
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
	requeued    bool         // put back in its lane by the runner that took it
	progress    time.Time
	firstErr    error // the error of a first run already made in a group

	// For WorkerObserver: when the jobs stream stored it, and whether it
	// was taken to run once.
	stored  time.Time
	started bool
}

// position names a fetched job in its partition: its stream sequence and
// its index in a batch message (0 for a one-job message); jobs of one
// batch share the sequence.
type position struct {
	seq   uint64
	index int
}

func (t *task) pos() position { return position{t.job.Seq, t.job.index} }

// before orders jobs as they were stored: by sequence, then in the batch.
func (t *task) before(u *task) bool {
	return t.job.Seq < u.job.Seq || t.job.Seq == u.job.Seq && t.job.index < u.job.index
}

// keptOutcome is a job's outcome as stored by ID.
type keptOutcome struct {
	res []byte
	err error
}

// lane holds the queued jobs of one key, in stream order.
//
// While the key's head job fails and retries (stalled), the lane keeps at
// most keep queued jobs (see lanes.keep); the others are handed back to
// the server (the caller NAKs them with a delay) so they do not hold the
// partition's in-flight window, and so do the key's arrivals while it is
// stalled. The jobs handed back and not yet returned (handedBack) are a
// gap in the lane: only queued jobs below the lowest of them run, so the
// key's order holds. Once the head settled, every returning job is taken,
// whatever its order, and new arrivals wait in the lane behind the gap
// instead of being handed back: nothing is handed back any more (unless
// the window is full, see lanes.waitRoom), so the gap closes as soon as
// the server has returned what was handed back, within the longest NAK
// delay, while the key's traffic keeps arriving. A lane with jobs handed
// back stays registered even when its queue is empty, so a later job
// cannot overtake them.
//
// A stalled lane keeps its queued jobs only while the window has room for
// other keys: when it is full and nothing else makes room, waitRoom hands
// kept jobs back too (evict), and the lane so squeezed keeps no more
// until its head settled.
type lane struct {
	key        string
	queue      []*task // by stream sequence
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

func (ln *lane) queued() int { return len(ln.queue) - ln.head }

// runnable returns how many queued jobs, from the head, lie below the
// lane's gap (all of them when nothing is handed back).
func (ln *lane) runnable() int {
	if len(ln.handedBack) == 0 {
		return ln.queued()
	}
	low := ln.handedBack.lowest()
	q := ln.queue[ln.head:]
	return sort.Search(len(q), func(i int) bool { return q[i].job.Seq > low })
}

// insert queues t in sequence order: behind the others, unless it is a
// handed-back job that came back after later ones arrived.
func (ln *lane) insert(t *task) {
	q := ln.queue[ln.head:]
	i := sort.Search(len(q), func(i int) bool { return t.before(q[i]) })
	ln.queue = slices.Insert(ln.queue, ln.head+i, t)
}

// lanes runs the jobs of one partition: one key's jobs at a time, in the
// order they were fetched, and different keys on up to `runners` goroutines.
// A fixed pool of runners takes ready lanes; no goroutine is started per job.
// A runner takes up to `group` queued jobs of its lane at once (for group
// commit) and runs them in order.
//
// The lanes hold at most `window` fetched jobs (MaxInFlight), not counting
// the head job of each stalled key: that one retries in its runner (one
// per stalled key; the server's window bounds them), and a failing key
// never fills the window alone, whatever its size. A stalled key keeps at
// most keep = min(stalledKeep, window/2) queued jobs, and only while the
// window has room: when it is full and no other job can free a place,
// stalled keys' kept jobs are handed back (waitRoom), so however many
// keys stall, the other keys' jobs are still fetched.
//
// At most `runners` runners hold a place (run jobs, or wait for a lane)
// at once: one waiting out a backoff gives its place up (pause), and
// takes one again before it goes on, so the handler never runs more than
// `runners` jobs at once.
type lanes struct {
	mu       sync.Mutex
	cond     *sync.Cond
	byKey    map[string]*lane
	ready    []*lane
	inflight map[position]*task // every fetched, unfinished job
	parts    int                // of inflight, jobs of batch messages: outside the window
	closed   bool               // no more tasks will be added
	dropping bool               // drop queued tasks instead of running them
	group    int                // most tasks handed to run at once
	window   int                // most fetched jobs held, stalled heads aside
	keep     int                // most queued jobs a stalled key keeps
	stalled  int                // lanes whose head job is retrying
	busy     int                // runners running tasks
	runners  int                // runners wanted, not counting those pausing
	live     int                // runner goroutines
	pausing  int                // runners waiting out a retry's backoff
	resuming int                // runners back from a backoff, waiting for a place
	run      func([]*task)      // runs a lane's tasks
	woken    bool               // waitRoom returns at once
	dropped  chan struct{}      // closed when close drops the queued jobs
	room     *sync.Cond         // signalled when in-flight jobs finish
	place    *sync.Cond         // signalled when a runner gives its place up
	wg       sync.WaitGroup
}

// fairness: a runner hands a busy lane back after this many runs (of one
// job, or one group) when other lanes are waiting, so one hot key cannot
// starve the rest.
const laneBurst = 32

func newLanes(runners, group, window int, run func([]*task)) *lanes {
	window = max(window, 1)
	l := &lanes{byKey: map[string]*lane{}, inflight: map[position]*task{}, group: max(group, 1), window: window, keep: min(stalledKeep, window/2),
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

// pause waits out a retry's backoff (d; it reports false if ctx ends or
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
func (l *lanes) pause(ctx context.Context, d time.Duration) bool {
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
func (l *lanes) spare() {
	if len(l.ready) > 0 && l.live-l.pausing < l.runners {
		l.live++
		l.wg.Add(1)
		go l.runner()
	}
}

// add queues t behind the earlier jobs of its key. It reports false for a
// job already in flight here (a redelivery racing the original), which the
// caller drops: the original's ack covers it. It reports handBack for a
// job of a stalled key the lane does not keep: the caller NAKs it with a
// delay, and the lane takes it when it comes back.
func (l *lanes) add(t *task) (ok, handBack bool) {
	ok, handBack, _ = l.addTo(t)
	return ok, handBack
}

// addTo is add, also telling whether the job's key is stalled.
func (l *lanes) addTo(t *task) (ok, handBack, stalled bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false, false, false
	}
	if _, dup := l.inflight[t.pos()]; dup {
		return false, false, false
	}
	ln := l.byKey[t.job.Key]
	if ln != nil {
		wasDup, back := ln.handedBack.has(t.job.Seq)
		if ln.stalled && t.batch == nil {
			// Keep only a job that goes right after the kept ones, and
			// only up to keep; the rest wait on the server.
			if ln.squeezed || ln.queued() >= l.keep || ln.handedBack.lowest() != 0 && t.job.Seq != ln.handedBack.lowest() {
				if !back {
					ln.handedBack.add(t.job.Seq, t.maybeDup)
				}
				return true, true, true
			}
		}
		// Not stalled: every job is taken, a returning one in its place,
		// a later one behind the gap.
		if back {
			ln.handedBack.remove(t.job.Seq)
			t.maybeDup = wasDup // its redelivery was ours, not a crash's
		}
	}
	t.progress = time.Now()
	l.inflight[t.pos()] = t
	if t.batch != nil {
		l.parts++
	}
	if ln == nil {
		ln = &lane{key: t.job.Key}
		l.byKey[t.job.Key] = ln
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

// stall marks key's lane as retrying its head job (or not) and returns the
// queued jobs beyond keep, and any behind the lane's gap, which the caller
// hands back to the server; they are no longer in flight here.
func (l *lanes) stall(key string, stalled bool) []*task {
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
	var back []*task
	kept := ln.queue[:cut]
	for _, t := range ln.queue[cut:] {
		if t.batch != nil {
			kept = append(kept, t) // never handed back: it waits behind the gap
			continue
		}
		back = append(back, t)
	}
	clear(ln.queue[len(kept):])
	ln.queue = kept
	for _, t := range back {
		l.forget(t)
		ln.handedBack.add(t.job.Seq, t.maybeDup)
	}
	return back
}

// waitRoom blocks while the lanes hold a full window of fetched jobs,
// until wake or close. When nothing can make room (no runner runs a job
// that is not a stalled head, no lane is ready), it takes a job out
// instead and returns it for the caller to hand back: the highest job
// waiting behind a lane's gap (back), as the jobs that close the gaps
// must still be delivered; else the highest job a stalled key keeps
// (stalledBack), as other keys' jobs must still be fetched however many
// keys stall.
func (l *lanes) waitRoom() (back, stalledBack []*task) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.inflight)-l.parts-l.stalled >= l.window && !l.closed && !l.woken {
		if len(l.ready) == 0 && l.busy <= l.stalled {
			if t := l.evict(); t != nil {
				back = append(back, t)
				continue
			}
			if t := l.evictKept(); t != nil {
				stalledBack = append(stalledBack, t)
				continue
			}
		}
		l.room.Wait()
	}
	return back, stalledBack
}

// evict takes the highest queued job waiting behind a lane's gap out of
// the lanes, as handed back, or returns nil when no job waits so.
func (l *lanes) evict() *task {
	for _, ln := range l.byKey {
		if ln.stalled || len(ln.handedBack) == 0 || ln.runnable() == ln.queued() {
			continue
		}
		if t := l.popLast(ln); t != nil {
			return t
		}
	}
	return nil
}

// evictKept takes the highest queued job of the stalled lane keeping the
// most jobs that can be handed back (one-job messages) out of the lanes,
// as handed back, and squeezes that lane: it keeps no returning job until
// its head settled, or its jobs would come back into the window only to
// be handed back again. It returns nil when no stalled lane keeps such a
// job. Its head stays: it runs in its runner, out of the window. A lane
// keeping only a batch's jobs is passed over: they cannot be handed back,
// and they hold no place in the window (lanes.parts); picking it by its
// queue's length handed nothing back and left the window full of the
// other stalled keys' jobs until a head settled.
func (l *lanes) evictKept() *task {
	var most *lane
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
		return nil
	}
	most.squeezed = true
	return l.popLast(most)
}

// handable is how many of ln's queued jobs can be handed back: those of
// one-job messages, which are also the ones counted in the window.
func (ln *lane) handable() int {
	n := 0
	for _, t := range ln.queue[ln.head:] {
		if t.batch == nil {
			n++
		}
	}
	return n
}

// popLast takes ln's last queued job that is not a batch's out of the
// lanes, as handed back; nil when every queued job is a batch's.
func (l *lanes) popLast(ln *lane) *task {
	last := len(ln.queue) - 1
	for last >= ln.head && ln.queue[last].batch != nil {
		last--
	}
	if last < ln.head {
		return nil
	}
	t := ln.queue[last]
	if last == len(ln.queue)-1 {
		ln.queue[last] = nil
		ln.queue = ln.queue[:last]
	} else {
		ln.queue = slices.Delete(ln.queue, last, last+1)
	}
	l.forget(t)
	ln.handedBack.add(t.job.Seq, t.maybeDup)
	return t
}

// forget takes t out of the in-flight jobs.
func (l *lanes) forget(t *task) {
	if _, ok := l.inflight[t.pos()]; !ok {
		return
	}
	delete(l.inflight, t.pos())
	if t.batch != nil {
		l.parts--
	}
}

// wake ends every waitRoom, now and later.
func (l *lanes) wake() {
	l.mu.Lock()
	l.woken = true
	l.room.Broadcast()
	l.mu.Unlock()
}

func (l *lanes) runner() {
	defer l.wg.Done()
	buf := make([]*task, 0, l.group)
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
func (l *lanes) next(ln *lane, n int, buf []*task) []*task {
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
		l.room.Broadcast() // a waitRoom may now hand back what waits behind the gap
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

func (l *lanes) done(ts []*task) {
	l.mu.Lock()
	l.busy--
	for _, t := range ts {
		if t.requeued {
			t.requeued = false
			continue
		}
		l.forget(t)
	}
	l.room.Broadcast()
	l.mu.Unlock()
}

// requeue puts tasks a runner took from key's lane but did not run back at
// the front of the lane, in order; they stay in flight, and the lane's next
// take (or a stall's hand-back) sees them again.
func (l *lanes) requeue(key string, ts []*task) {
	if len(ts) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ln := l.byKey[key]
	if ln == nil || l.dropping {
		return // dropped with the lanes: the next consumer delivers them again
	}
	q := make([]*task, 0, len(ts)+ln.queued())
	for _, t := range ts {
		t.requeued = true
		q = append(q, t)
	}
	ln.queue = append(q, ln.queue[ln.head:]...)
	ln.head = 0
}

// touch calls fn for every in-flight task whose last progress is older than
// age, and restarts its clock. Used to send InProgress for jobs that wait or
// run long, so the server does not redeliver them.
func (l *lanes) touch(age time.Duration, fn func(*task)) {
	now := time.Now()
	var due []*task
	l.mu.Lock()
	for _, t := range l.inflight {
		if now.Sub(t.progress) >= age {
			t.progress = now
			due = append(due, t)
		}
	}
	l.mu.Unlock()
	for _, t := range due {
		fn(t)
	}
}

// handedBackNow returns how many jobs the lanes handed back that have not
// come back yet.
func (l *lanes) handedBackNow() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ln := range l.byKey {
		n += len(ln.handedBack)
	}
	return n
}

// pending returns how many fetched jobs are not finished.
func (l *lanes) pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.inflight)
}

// close stops the runners once every queued job has run (drop=false), or
// once the running ones return, dropping the queued ones (drop=true). It
// waits for the runners to exit.
func (l *lanes) close(drop bool) {
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

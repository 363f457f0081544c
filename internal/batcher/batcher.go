// Package batcher coalesces a client's concurrent jobs bound for one
// partition into batches, one batch in flight per partition at a time
// (see "Batches on the wire" in package jetstream's doc). It knows
// nothing of NATS: Send does the sending.
//
// The discipline:
//
//   - A job for a partition with nothing in flight is sent at once,
//     alone: a lone job after a quiet spell is never delayed. With a
//     Cork, a job for a busy partition (its previous send returned less
//     than 4×Cork ago) waits up to Cork for company first, and goes as
//     soon as the batch is full: the callers of a busy partition come
//     back in a burst once their batch is answered, and a job sent alone
//     ahead of them would cost the burst a second send (and, on a server
//     that syncs every write, a second fsync) for nothing.
//   - Jobs that arrive while that partition's send is in flight queue, in
//     arrival order. When the send returns, the queue goes as the next
//     batch, cut at MaxCount jobs or MaxBytes (by Size), whichever first;
//     the rest waits for the batch after. With a Linger, a batch shorter
//     than a full one waits up to that long for more jobs after the send
//     returned, and goes as soon as it is full.
//   - Send returns one outcome per job; each caller gets its own.
//   - A caller whose context ends while its job is queued takes the job
//     out (ErrNotSent: nothing sent); once its batch is sent it returns
//     at once (ErrUnknown: sent, outcome unknown) and the batch goes on
//     for the others. One caller's context never cancels another's job.
//   - Close fails every queued job (ErrClosed, nothing sent) and waits for
//     the sends in flight, whose callers get their outcomes.
//
// A Batcher is safe for concurrent use.
package batcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

var (
	// ErrClosed is returned for a job given to a closed Batcher, or queued
	// when it was closed: nothing of it was sent.
	ErrClosed = errors.New("batcher: closed, job not sent")
	// ErrNotSent is returned, with the context's error, for a job whose
	// caller's context ended while it was queued: nothing was sent.
	ErrNotSent = errors.New("batcher: job not sent")
	// ErrUnknown is returned, with the context's error, for a job whose
	// caller's context ended after its batch was sent: it may be stored.
	ErrUnknown = errors.New("batcher: job sent, outcome unknown")
	// ErrOutcomes is returned for every job of a batch whose Send returned
	// another number of outcomes than jobs.
	ErrOutcomes = errors.New("batcher: send returned the wrong number of outcomes")
)

// Outcome is what Send returns for one job.
type Outcome[R any] struct {
	Value R
	Err   error
}

// Config configures a Batcher.
type Config[T, R any] struct {
	// Send sends one batch of jobs of one partition, in order, and returns
	// one outcome per job, in the same order. It is called for at most one
	// batch per partition at a time. ctx ends only when Close gives up
	// waiting. Required.
	Send func(ctx context.Context, partition int, jobs []T) []Outcome[R]
	// Size is a job's size in bytes, for MaxBytes. Defaults to 0 for every
	// job (only MaxCount cuts).
	Size func(T) int
	// MaxCount is the most jobs a batch holds. Defaults to 256.
	MaxCount int
	// MaxBytes is the most bytes (by Size) a batch of two jobs or more
	// holds; a job larger than it goes alone. Defaults to no limit.
	MaxBytes int
	// Linger is how long a batch shorter than full waits for more jobs
	// after the partition's previous send returned. Defaults to 0: only
	// the jobs that queued meanwhile.
	Linger time.Duration
	// Cork is how long a job for a busy partition with nothing in flight
	// waits for more jobs before it is sent: busy when the partition's
	// previous send returned less than 4×Cork ago. Defaults to 0: a job
	// for a partition with nothing in flight goes at once.
	Cork time.Duration
	// Seal, if set, is called with a batch's jobs as it is cut, before
	// any caller can see them sent: what it writes into them is what a
	// caller whose context ends then (ErrUnknown) reads. It must not
	// block. Defaults to none.
	Seal func(partition int, jobs []T)
}

// Batcher sends jobs in batches per partition. The zero value is not
// usable; see New.
type Batcher[T, R any] struct {
	cfg    Config[T, R]
	ctx    context.Context // the sends'; cancelled when Close gives up
	cancel context.CancelFunc

	mu     sync.Mutex
	parts  map[int]*part[T, R]
	closed bool
	sends  sync.WaitGroup
}

// part is one partition's state.
type part[T, R any] struct {
	inflight bool
	queue    []*pending[T, R]
	bytes    int         // of the queue, by Size
	linger   *time.Timer // set while a short batch lingers (or corks)
	lastSent time.Time   // when the partition's previous send returned
}

// pending is one caller's job.
type pending[T, R any] struct {
	job  T
	size int
	sent bool            // taken into a batch (under mu)
	done chan Outcome[R] // buffered 1: the send never blocks on a caller
}

// New returns a Batcher, or an error for a Config it cannot run.
func New[T, R any](cfg Config[T, R]) (*Batcher[T, R], error) {
	if cfg.Send == nil {
		return nil, errors.New("batcher: Config.Send is required")
	}
	if cfg.MaxCount < 0 || cfg.MaxBytes < 0 || cfg.Linger < 0 || cfg.Cork < 0 {
		return nil, fmt.Errorf("batcher: MaxCount %d, MaxBytes %d, Linger %s and Cork %s must not be negative", cfg.MaxCount, cfg.MaxBytes, cfg.Linger, cfg.Cork)
	}
	if cfg.MaxCount == 0 {
		cfg.MaxCount = 256
	}
	if cfg.Size == nil {
		cfg.Size = func(T) int { return 0 }
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Batcher[T, R]{cfg: cfg, ctx: ctx, cancel: cancel, parts: map[int]*part[T, R]{}}, nil
}

// Do sends job to partition, alone or in a batch, and returns its
// outcome. It blocks until Send returned the job's outcome, ctx ended or
// the Batcher was closed with the job still queued.
func (b *Batcher[T, R]) Do(ctx context.Context, partition int, job T) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, errors.Join(ErrNotSent, err)
	}
	pd := &pending[T, R]{job: job, size: b.cfg.Size(job), done: make(chan Outcome[R], 1)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return zero, ErrClosed
	}
	p := b.parts[partition]
	if p == nil {
		p = &part[T, R]{}
		b.parts[partition] = p
	}
	p.queue = append(p.queue, pd)
	p.bytes += pd.size
	b.maybeSendLocked(partition, p)
	b.mu.Unlock()

	select {
	case o := <-pd.done:
		return o.Value, o.Err
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !pd.sent {
		if p.remove(pd) {
			return zero, errors.Join(ErrNotSent, ctx.Err())
		}
	}
	select {
	case o := <-pd.done: // settled meanwhile (or failed by Close)
		return o.Value, o.Err
	default:
		return zero, errors.Join(ErrUnknown, ctx.Err())
	}
}

// remove takes pd out of the queue; false if it is not there.
func (p *part[T, R]) remove(pd *pending[T, R]) bool {
	for i, q := range p.queue {
		if q == pd {
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			p.bytes -= pd.size
			return true
		}
	}
	return false
}

// full reports whether the queue holds at least a full batch.
func (b *Batcher[T, R]) full(p *part[T, R]) bool {
	return len(p.queue) >= b.cfg.MaxCount || b.cfg.MaxBytes > 0 && p.bytes >= b.cfg.MaxBytes && len(p.queue) > 1
}

// maybeSendLocked sends the next batch of partition if nothing of it is
// in flight: at once when alone after a quiet spell, when full, or
// without a linger; else it starts the linger.
func (b *Batcher[T, R]) maybeSendLocked(partition int, p *part[T, R]) {
	if p.inflight || len(p.queue) == 0 || b.closed {
		return
	}
	if p.linger != nil && !b.full(p) {
		return // lingering: the timer or a full queue sends it
	}
	if p.linger == nil && b.cfg.Cork > 0 && !b.full(p) && time.Since(p.lastSent) < 4*b.cfg.Cork {
		b.waitLocked(partition, p, b.cfg.Cork) // busy: corked
		return
	}
	b.sendLocked(partition, p)
}

// waitLocked holds partition's short batch for up to d: a full queue, or
// the timer, sends it.
func (b *Batcher[T, R]) waitLocked(partition int, p *part[T, R], d time.Duration) {
	// (t is set before the timer's func can take mu, held here.)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if p.linger != t { // sent full meanwhile, or closed
			return
		}
		p.linger = nil
		if !p.inflight && len(p.queue) > 0 && !b.closed {
			b.sendLocked(partition, p)
		}
	})
	p.linger = t
}

// afterSendLocked is maybeSendLocked once a send returned: a short batch
// lingers first, if Linger says so.
func (b *Batcher[T, R]) afterSendLocked(partition int, p *part[T, R]) {
	if len(p.queue) == 0 || b.closed {
		return
	}
	if b.cfg.Linger > 0 && !b.full(p) {
		b.waitLocked(partition, p, b.cfg.Linger)
		return
	}
	b.sendLocked(partition, p)
}

// sendLocked takes the next batch off the queue and sends it on a
// goroutine of its own, which Close waits for.
func (b *Batcher[T, R]) sendLocked(partition int, p *part[T, R]) {
	if p.linger != nil {
		p.linger.Stop()
		p.linger = nil
	}
	n, bytes := 0, 0
	for n < len(p.queue) && n < b.cfg.MaxCount {
		s := p.queue[n].size
		if n > 0 && b.cfg.MaxBytes > 0 && bytes+s > b.cfg.MaxBytes {
			break
		}
		bytes += s
		n++
	}
	batch := make([]*pending[T, R], n)
	copy(batch, p.queue[:n])
	p.queue = append(p.queue[:0], p.queue[n:]...)
	p.bytes -= bytes
	jobs := make([]T, n)
	for i, pd := range batch {
		jobs[i] = pd.job
	}
	if b.cfg.Seal != nil {
		b.cfg.Seal(partition, jobs)
	}
	for _, pd := range batch {
		pd.sent = true
	}
	p.inflight = true
	b.sends.Add(1)
	go func() {
		defer b.sends.Done()
		outs := b.cfg.Send(b.ctx, partition, jobs)
		for i, pd := range batch {
			if len(outs) != len(batch) {
				pd.done <- Outcome[R]{Err: fmt.Errorf("%w: %d for %d jobs", ErrOutcomes, len(outs), len(batch))}
				continue
			}
			pd.done <- outs[i]
		}
		b.mu.Lock()
		p.inflight = false
		p.lastSent = time.Now()
		b.afterSendLocked(partition, p)
		b.mu.Unlock()
	}()
}

// Close fails every queued job with ErrClosed and waits for the sends in
// flight. If ctx ends first it cancels their context, waits for them to
// return, and returns ctx's error. Do after Close returns ErrClosed.
// Close is safe to call more than once.
func (b *Batcher[T, R]) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	for _, p := range b.parts {
		if p.linger != nil {
			p.linger.Stop()
			p.linger = nil
		}
		for _, pd := range p.queue {
			pd.done <- Outcome[R]{Err: ErrClosed}
		}
		p.queue, p.bytes = nil, 0
	}
	b.mu.Unlock()
	done := make(chan struct{})
	go func() {
		b.sends.Wait()
		close(done)
	}()
	select {
	case <-done:
		b.cancel()
		return nil
	case <-ctx.Done():
		b.cancel()
		<-done
		return fmt.Errorf("batcher: close: sends cancelled: %w", ctx.Err())
	}
}

// Queued returns how many jobs of partition wait for a send (for tests).
func (b *Batcher[T, R]) Queued(partition int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.parts[partition]; p != nil {
		return len(p.queue)
	}
	return 0
}

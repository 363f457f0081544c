package fallback

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// RedLock is the Redlock algorithm over N independent Redis servers (not
// replicas of one another): a lock is held when N/2+1 of them granted it
// within its validity. See the package documentation for what that does and
// does not guarantee. It is safe for concurrent use.
type RedLock struct {
	c      *core
	quorum int
}

// NewRedLock returns a RedLock over clients, one per independent server.
// It needs at least one client; use an odd number, typically 5. A nil cfg
// means the zero Config.
func NewRedLock(clients []Client, cfg *Config) (*RedLock, error) {
	if len(clients) == 0 {
		return nil, errors.New("fallback: RedLock needs at least one client")
	}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("fallback: RedLock client %d is nil", i)
		}
	}
	c, err := newCore(clients, cfg)
	if err != nil {
		return nil, err
	}
	return &RedLock{c: c, quorum: len(clients)/2 + 1}, nil
}

// Close abandons every lock still held through r and waits for every
// goroutine r started.
func (r *RedLock) Close() error { return r.c.close() }

// Mutex returns the lock named key over all nodes. WithOwner is not
// supported.
func (r *RedLock) Mutex(key string) *Mutex {
	return &Mutex{c: r.c, name: key, k: r.c.cfg.keys(key), red: r}
}

// Do locks key on a quorum, runs fn, and unlocks, as Mutex.Do.
func (r *RedLock) Do(ctx context.Context, key string, fn func(ctx context.Context, fence uint64) error, opts ...Option) error {
	return r.Mutex(key).Do(ctx, fn, opts...)
}

// nodeResult is one node's answer to one call.
type nodeResult struct {
	ok  bool
	num int64
	err error
}

// each runs fn on every node in parallel and waits for all of them.
func (r *RedLock) each(ctx context.Context, fn func(ctx context.Context, i int, n *node) nodeResult) []nodeResult {
	out := make([]nodeResult, len(r.c.nodes))
	var wg sync.WaitGroup
	for i, n := range r.c.nodes {
		wg.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, r.c.cfg.NodeTimeout)
			defer cancel()
			res := fn(nctx, i, n)
			if res.err != nil {
				res.err = fmt.Errorf("node %d: %w", i, res.err)
			}
			out[i] = res
		})
	}
	wg.Wait()
	return out
}

func (r *RedLock) lock(ctx context.Context, m *Mutex, block bool, o lockOptions) (*Lock, error) {
	if o.owner != "" || m.fair {
		return nil, errReentrantUnsupported
	}
	token := newToken()
	ttlMS := strconv.FormatInt(o.ttl.Milliseconds(), 10)
	margin := r.c.cfg.margin(o.ttl)
	lockKeys := []string{m.k.lock, m.k.fence}

	releaseAll := func(ctx context.Context) []nodeResult {
		return r.each(ctx, func(ctx context.Context, _ int, n *node) nodeResult {
			v, err := releaseScript.run(ctx, n.scripts, []string{m.k.lock}, token, m.k.channel)
			return nodeResult{ok: v == int64(1), err: err}
		})
	}

	try := func(ctx context.Context, _ bool) (attemptResult, error) {
		start := time.Now()
		res := r.each(ctx, func(ctx context.Context, _ int, n *node) nodeResult {
			v, err := acquireScript.run(ctx, n.scripts, lockKeys, token, ttlMS)
			if err != nil {
				return nodeResult{err: err}
			}
			ok, num, err := acquireReply(v)
			return nodeResult{ok: ok, num: num, err: err}
		})
		var fence int64
		var errs []error
		granted, refusedBy := 0, 0
		var retryIn time.Duration
		for _, x := range res {
			switch {
			case x.err != nil:
				errs = append(errs, x.err)
				if errors.Is(x.err, ErrRefused) {
					refusedBy++
				}
			case x.ok:
				granted++
				fence = max(fence, x.num)
			case x.num > 0 && (retryIn == 0 || time.Duration(x.num)*time.Millisecond < retryIn):
				retryIn = time.Duration(x.num) * time.Millisecond
			}
		}
		// Second phase: raise every granting node's counter to the chosen
		// fence, so the next quorum (which shares a node with this one)
		// draws a larger number.
		if granted >= r.quorum {
			raised := r.each(ctx, func(ctx context.Context, _ int, n *node) nodeResult {
				v, err := fenceRaiseScript.run(ctx, n.scripts, lockKeys, token, fence)
				return nodeResult{ok: v == int64(1), err: err}
			})
			granted = 0
			for _, x := range raised {
				if x.ok {
					granted++
				}
			}
		}
		validity := o.ttl - time.Since(start) - margin
		if granted >= r.quorum && validity > 0 {
			return attemptResult{ok: true, fence: uint64(fence), sent: start}, nil
		}
		// Failed: release on all nodes, including those that did not
		// answer, since they may have applied the command.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ttl)
		releaseAll(rctx)
		cancel()
		if validity <= 0 && granted >= r.quorum {
			errs = append(errs, fmt.Errorf("validity used up (%v)", validity))
		}
		qe := &QuorumError{Acquired: granted, Needed: r.quorum, Nodes: len(r.c.nodes), Err: errors.Join(errs...)}
		if refusedBy > len(r.c.nodes)-r.quorum {
			// Too many nodes refuse our credentials for a quorum ever to
			// form: waiting would only repeat the refusal.
			return attemptResult{}, qe
		}
		return attemptResult{retryIn: retryIn, soft: qe}, nil
	}

	res, err := r.c.acquire(ctx, block, waitSpec{channel: m.k.channel}, try)
	if err != nil {
		return nil, err
	}
	ops := lockOps{
		renew: func(ctx context.Context) (bool, error) {
			res := r.each(ctx, func(ctx context.Context, _ int, n *node) nodeResult {
				v, err := renewScript.run(ctx, n.scripts, []string{m.k.lock}, token, ttlMS)
				return nodeResult{ok: v == int64(1), err: err}
			})
			return r.tally(res)
		},
		release: func(ctx context.Context) (bool, error) {
			return r.releaseTally(releaseAll(ctx))
		},
	}
	return r.c.track(ctx, m.name, res, o, ops)
}

// count splits per-node answers into yes, no and errors.
func count(res []nodeResult) (yes, no int, errs []error) {
	for _, x := range res {
		switch {
		case x.err != nil:
			errs = append(errs, x.err)
		case x.ok:
			yes++
		default:
			no++
		}
	}
	return yes, no, errs
}

// tally turns per-node answers into held (a quorum said yes), not held (a
// quorum can no longer say yes), or an error joining the per-node errors.
func (r *RedLock) tally(res []nodeResult) (bool, error) {
	yes, no, errs := count(res)
	switch {
	case yes >= r.quorum:
		return true, nil
	case no > len(res)-r.quorum:
		return false, nil
	}
	return false, &QuorumError{Acquired: yes, Needed: r.quorum, Nodes: len(res), Err: errors.Join(errs...)}
}

// releaseTally judges a release sent to every node. Once a quorum of nodes
// has answered, no quorum can still hold this token (keys on unreachable
// nodes expire by TTL), so the release succeeded if at least one node
// deleted the key, unless a quorum says the token was not there: then the
// lock had been lost (ErrNotHeld). A node killed while we held the lock can leave fewer
// than a quorum of holders; that still is a clean release.
func (r *RedLock) releaseTally(res []nodeResult) (bool, error) {
	yes, no, errs := count(res)
	switch {
	case no >= r.quorum:
		return false, nil // a quorum says the token is not there: not held
	case yes+no >= r.quorum:
		return yes > 0, nil
	}
	return false, &QuorumError{Acquired: yes + no, Needed: r.quorum, Nodes: len(res), Err: errors.Join(errs...)}
}

package fallback

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// notifier shares one pub/sub connection among every waiter of a node.
// Each release channel is subscribed while at least one waiter waits on it.
// For a plain or reentrant mutex a release wakes one waiter (the one that
// has waited longest); for fair and read-write locks it wakes all, since
// who may go next is decided by the script.
type notifier struct {
	client Client
	log    *slog.Logger

	mu     sync.Mutex
	ps     *redis.PubSub
	subs   map[string]*subscription
	closed bool
	done   chan struct{} // closed when the reader goroutine exits
}

type subscription struct {
	ready     chan struct{} // closed on the server's subscribe confirmation
	confirmed bool
	wakeAll   bool
	waiters   []*waiter
}

type waiter struct {
	channel string
	wake    chan struct{} // buffered, 1; shared by the waiter's nodes
}

func newNotifier(c Client, log *slog.Logger) *notifier {
	return &notifier{client: c, log: log, subs: make(map[string]*subscription)}
}

// register adds a waiter on channel and returns a channel closed once the
// subscription is active. It returns ErrClosed after close.
func (n *notifier) register(ctx context.Context, channel string, wakeAll bool, wake chan struct{}) (*waiter, <-chan struct{}, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, nil, ErrClosed
	}
	if n.ps == nil {
		n.ps = n.client.Subscribe(context.WithoutCancel(ctx))
		n.done = make(chan struct{})
		go n.loop(n.ps.ChannelWithSubscriptions(), n.done)
	}
	w := &waiter{channel: channel, wake: wake}
	s := n.subs[channel]
	if s == nil {
		s = &subscription{ready: make(chan struct{}), wakeAll: wakeAll}
		n.subs[channel] = s
		if err := n.ps.Subscribe(context.WithoutCancel(ctx), channel); err != nil {
			// Not fatal: go-redis resubscribes on reconnect, and the
			// backoff covers the gap.
			n.log.DebugContext(ctx, "fallback: subscribe failed", "channel", channel, "error", err)
		}
	}
	s.waiters = append(s.waiters, w)
	return w, s.ready, nil
}

func (n *notifier) unregister(w *waiter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.subs[w.channel]
	if s == nil {
		return
	}
	i := slices.Index(s.waiters, w)
	if i < 0 {
		return
	}
	s.waiters = slices.Delete(s.waiters, i, i+1)
	// A wake-one signal this waiter did not consume goes to the next one.
	if !s.wakeAll {
		select {
		case <-w.wake:
			n.wakeLocked(s)
		default:
		}
	}
	if len(s.waiters) == 0 {
		delete(n.subs, w.channel)
		if !n.closed {
			_ = n.ps.Unsubscribe(context.Background(), w.channel)
		}
	}
}

func (n *notifier) loop(msgs <-chan any, done chan struct{}) {
	defer close(done)
	for m := range msgs {
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			n.mu.Lock()
			if s := n.subs[m.Channel]; s != nil && !s.confirmed {
				s.confirmed = true
				close(s.ready)
			}
			n.mu.Unlock()
		case *redis.Message:
			n.mu.Lock()
			if s := n.subs[m.Channel]; s != nil {
				n.wakeLocked(s)
			}
			n.mu.Unlock()
		}
	}
}

func (n *notifier) wakeLocked(s *subscription) {
	for _, w := range s.waiters {
		select {
		case w.wake <- struct{}{}:
			if !s.wakeAll {
				return
			}
		default:
		}
	}
}

func (n *notifier) close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	ps, done := n.ps, n.done
	n.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
		<-done
	}
}

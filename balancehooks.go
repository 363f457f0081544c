package keylane

import (
	"context"

	"github.com/keylane/keylane/internal/balance"
	"github.com/keylane/keylane/lease"
)

// The worker's binding to internal/balance, which decides which
// partitions the worker owns: the balancer is built from the worker's
// config and topology, and the owner (owner.go) is its balance.Owner. The
// owner's methods below keep the names the engine calls them by; they go
// when the owner moves to its own room (docs/layout.md).

// balancer is the worker's balancer.
type balancer = balance.Balancer[*owner]

// startBalancer registers w as a member of its topology and starts
// balancing (balance.Start).
func startBalancer(ctx context.Context, w *Worker) (*balancer, error) {
	return balance.Start(ctx, balance.Config[*owner]{
		ID:         w.cfg.ID,
		Partitions: w.topo.Partitions,
		Members:    w.topo.Members,
		Leases:     w.topo.Leases,
		LeaseKey:   w.topo.Names.LeaseKey,
		Lease:      w.leaseConfig(),
		NewOwner:   func(p int, l *lease.Lease) *owner { return newOwner(w, p, l) },
		Acquired:   func() { w.stats.acquired.Add(1) },
		Stuck:      func() { w.stats.stuck.Add(1) },
		Log:        w.log,
	})
}

// Run runs the tenure (balance.Owner).
func (o *owner) Run() { o.run() }

// HandOver asks the owner to finish and release its lease (balance.Owner).
func (o *owner) HandOver() { o.handOver() }

// Abort asks the owner to stop now (balance.Owner).
func (o *owner) Abort() { o.abort() }

// Done is closed once Run has returned (balance.Owner).
func (o *owner) Done() <-chan struct{} { return o.done }

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
		NewOwner:   func(p int, l *lease.Lease) *owner { return newOwner(w.ownerConfig(p, l)) },
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

// ownerConfig is what the tenure of partition p under lease l is built
// from: the worker's config, connection, topology, stores and counters.
func (w *Worker) ownerConfig(p int, l *lease.Lease) ownerConfig {
	c := &w.cfg
	return ownerConfig{
		Partition: p, Lease: l, Log: w.log,
		NC: w.nc, JS: w.js, Topology: w.topo,
		Handler: c.Handler, Reducer: c.Reducer, Applier: c.Applier, Observer: c.Observer,
		Backoff: c.Backoff, MaxDeliver: c.MaxDeliver, AckWait: c.AckWait, MaxPending: c.MaxPending,
		MaxInFlight: c.MaxInFlight, Concurrency: c.Concurrency, StoreResults: c.StoreResults,
		WorkerID: c.ID, LeaseTTL: c.Topology.LeaseTTL,
		State: w.state.s, Kept: &w.kept, OutcomeBatchMin: w.outcomeBatchMin(), Tracing: w.tracing,
		Stats:         &w.stats.ownerStats,
		RequestReload: w.requestReload,
		RefreshEpoch:  w.refreshEpoch,
	}
}

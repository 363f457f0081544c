package keylane

import (
	"context"

	"github.com/keylane/keylane/internal/balance"
	"github.com/keylane/keylane/internal/tenure"
	"github.com/keylane/keylane/lease"
)

// The worker's bindings to internal/balance, which decides which
// partitions the worker owns, and to internal/tenure, which runs one: the
// balancer is built from the worker's config and topology, and each
// tenure (a *tenure.Owner, the balancer's balance.Owner) from an explicit
// tenure.Config the worker fills.

// balancer is the worker's balancer.
type balancer = balance.Balancer[*tenure.Owner]

// startBalancer registers w as a member of its topology and starts
// balancing (balance.Start).
func startBalancer(ctx context.Context, w *Worker) (*balancer, error) {
	return balance.Start(ctx, balance.Config[*tenure.Owner]{
		ID:         w.cfg.ID,
		Partitions: w.topo.Partitions,
		Members:    w.topo.Members,
		Leases:     w.topo.Leases,
		LeaseKey:   w.topo.Names.LeaseKey,
		Lease:      w.leaseConfig(),
		NewOwner:   func(p int, l *lease.Lease) *tenure.Owner { return tenure.New(w.tenureConfig(p, l)) },
		Acquired:   func() { w.stats.acquired.Add(1) },
		Stuck:      func() { w.stats.stuck.Add(1) },
		Log:        w.log,
	})
}

// tenureConfig is what the tenure of partition p under lease l is built
// from: the worker's config, connection, topology, stores and counters.
// The topology is the worker's when the tenure starts: a repartition
// hands every tenure over before it replaces it.
func (w *Worker) tenureConfig(p int, l *lease.Lease) tenure.Config {
	c := &w.cfg
	return tenure.Config{
		Partition: p, Lease: l, Log: w.log,
		NC: w.nc, JS: w.js, Topology: w.topo.Topology,
		Handler: c.Handler, Reducer: c.Reducer, Applier: c.Applier, Observer: c.Observer,
		Backoff: c.Backoff, MaxDeliver: c.MaxDeliver, AckWait: c.AckWait, MaxPending: c.MaxPending,
		MaxInFlight: c.MaxInFlight, Concurrency: c.Concurrency, StoreResults: c.StoreResults,
		WorkerID: c.ID, LeaseTTL: c.Topology.LeaseTTL,
		State: w.state.s, Kept: &w.kept, OutcomeBatchMin: w.outcomeBatchMin(), Tracing: w.tracing,
		Stats:         &w.stats.Stats,
		RequestReload: w.requestReload,
		RefreshEpoch:  w.refreshEpoch,
	}
}

// outcomeBatchMin returns the fewest puts that go as a batch
// (WorkerConfig.OutcomeBatch), or 0 for none.
func (w *Worker) outcomeBatchMin() int {
	switch n := w.cfg.OutcomeBatch; {
	case n < 0:
		return 0
	case n > 0:
		return max(n, 2) // a batch of one is a plain put
	case w.topo != nil && w.topo.Replicas > 1:
		return 2
	}
	return 0
}

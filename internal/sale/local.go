package sale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/embedded"
	"github.com/keylane/keylane/inventory"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LocalConfig describes a whole keylane deployment inside one process: an
// embedded NATS server (unless URL is set) and several inventory workers.
type LocalConfig struct {
	// URL of an existing NATS server. Defaults to starting an embedded one.
	URL string
	// Dir holds the embedded server's store. Defaults to a new temporary
	// directory, removed on Stop.
	Dir string
	// Port of the embedded server. Defaults to a free port.
	Port int
	// SyncAlways makes the embedded server fsync every write.
	SyncAlways bool
	// OutcomeBatch is the workers' WorkerConfig.OutcomeBatch; 0 with
	// SyncAlways is keylane.SyncAlwaysOutcomeBatch, as cmd/worker
	// --sync-always.
	OutcomeBatch int
	// StateBatch is the workers' WorkerConfig.StateBatch.
	StateBatch int
	// Workers is how many workers to run. Defaults to 3.
	Workers int
	// Topology of the namespace. Defaults as in TopologyConfig.
	Topology keylane.TopologyConfig
	// BatchCork is the clients' ClientConfig.BatchCork.
	BatchCork time.Duration
	// Concurrency per partition. Defaults as in WorkerConfig.
	Concurrency int
	// Hold is the handler's pause inside the critical section.
	Hold time.Duration
	// PerJobWrites runs the inventory as a Handler, one state write per
	// job, instead of as a Reducer whose jobs the worker group-commits.
	// For comparison only.
	PerJobWrites bool
	// Applier, if set, is the workers' WorkerConfig.Applier (a sale into
	// the user's database, as pg/cmd/sale runs); Hold and PerJobWrites
	// are then ignored.
	Applier keylane.GroupApplier
	// Tracker is the tracker the workers' runs report to (an Applier's
	// handler reports itself). Defaults to a new one.
	Tracker *Tracker
	// Logger for the workers. Defaults to discarding.
	Logger *slog.Logger
	// WorkerObserver and ClientObserver measure the workers and the
	// clients from Client (keylane.WorkerConfig.Observer,
	// keylane.ClientConfig.Observer). Default to nil.
	WorkerObserver *keylane.WorkerObserver
	ClientObserver *keylane.ClientObserver
}

// Local is a running in-process deployment.
type Local struct {
	Server  *server.Server // nil when URL was given
	URL     string
	Tracker *Tracker
	Workers []*keylane.Worker
	conns   []*nats.Conn
	tmp     string
	ns      string
	cork    time.Duration // the clients' BatchCork (LocalConfig.BatchCork)
	obs     *keylane.ClientObserver
}

// StartLocal starts the server and the workers and waits until every
// partition has an owner.
func StartLocal(ctx context.Context, cfg LocalConfig) (*Local, error) {
	if cfg.Workers == 0 {
		cfg.Workers = 3
	}
	if cfg.Tracker == nil {
		cfg.Tracker = NewTracker(nil, "")
	}
	l := &Local{URL: cfg.URL, Tracker: cfg.Tracker, ns: cfg.Topology.Namespace, cork: cfg.BatchCork, obs: cfg.ClientObserver}
	if l.URL == "" {
		dir := cfg.Dir
		if dir == "" {
			d, err := os.MkdirTemp("", "keylane-")
			if err != nil {
				return nil, err
			}
			dir, l.tmp = d, d
		}
		port := cfg.Port
		if port == 0 {
			port = -1
		}
		s, err := embedded.Start(embedded.Config{Port: port, StoreDir: dir, SyncAlways: cfg.SyncAlways})
		if err != nil {
			l.Stop(ctx)
			return nil, err
		}
		l.Server, l.URL = s, s.ClientURL()
	}
	for i := 0; i < cfg.Workers; i++ {
		nc, err := nats.Connect(l.URL, nats.Name(fmt.Sprintf("keylane-worker-%d", i)))
		if err != nil {
			l.Stop(ctx)
			return nil, err
		}
		l.conns = append(l.conns, nc)
		wcfg := keylane.WorkerConfig{Reducer: &Handler{Inventory: &inventory.Handler{}, Hold: cfg.Hold, Tracker: l.Tracker}}
		if cfg.Applier != nil {
			wcfg = keylane.WorkerConfig{Applier: cfg.Applier}
		} else if cfg.PerJobWrites {
			js, err := jetstream.New(nc)
			if err != nil {
				l.Stop(ctx)
				return nil, err
			}
			topo, err := keylane.Setup(ctx, js, cfg.Topology)
			if err != nil {
				l.Stop(ctx)
				return nil, err
			}
			wcfg = keylane.WorkerConfig{Handler: &Handler{Inventory: &inventory.Handler{State: keylane.NewState(topo.State)}, Hold: cfg.Hold, Tracker: l.Tracker}}
		}
		w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
			Topology:     cfg.Topology,
			Handler:      wcfg.Handler,
			Reducer:      wcfg.Reducer,
			Applier:      wcfg.Applier,
			ID:           fmt.Sprintf("local-%d-%d", os.Getpid(), i),
			Concurrency:  cfg.Concurrency,
			OutcomeBatch: outcomeBatch(cfg),
			StateBatch:   cfg.StateBatch,
			Logger:       cfg.Logger,
			Observer:     cfg.WorkerObserver,
		})
		if err != nil {
			l.Stop(ctx)
			return nil, err
		}
		if err := w.Start(ctx); err != nil {
			l.Stop(ctx)
			return nil, err
		}
		l.Workers = append(l.Workers, w)
	}
	n := l.Workers[0].Topology().Partitions
	for {
		owned := 0
		for _, w := range l.Workers {
			owned += len(w.Owned())
		}
		if owned == n {
			return l, nil
		}
		select {
		case <-ctx.Done():
			l.Stop(context.Background())
			return nil, errors.Join(errors.New("sale: partitions not all owned"), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Client connects a new client to the deployment; it is closed by Stop.
func (l *Local) Client(ctx context.Context) (*keylane.Client, error) {
	nc, err := nats.Connect(l.URL, nats.Name("keylane-client"))
	if err != nil {
		return nil, err
	}
	l.conns = append(l.conns, nc)
	return keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: l.ns, BatchCork: l.cork, Observer: l.obs})
}

// Stop stops the workers gracefully, then the server.
func (l *Local) Stop(ctx context.Context) {
	var wg sync.WaitGroup
	for _, w := range l.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = w.Stop(ctx)
		}()
	}
	wg.Wait()
	for _, nc := range l.conns {
		nc.Close()
	}
	if l.Server != nil {
		l.Server.Shutdown()
		l.Server.WaitForShutdown()
	}
	if l.tmp != "" {
		_ = os.RemoveAll(l.tmp)
	}
}

func outcomeBatch(cfg LocalConfig) int {
	if cfg.OutcomeBatch == 0 && cfg.SyncAlways && cfg.URL == "" {
		return keylane.SyncAlwaysOutcomeBatch
	}
	return cfg.OutcomeBatch
}

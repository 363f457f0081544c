package balance

import (
	"errors"
	"log/slog"

	"github.com/keylane/keylane/lease"
	"github.com/nats-io/nats.go/jetstream"
)

// Owner runs one partition for as long as its lease holds: the worker's
// tenure. The balancer makes one with Config.NewOwner for every lease it
// takes, runs it, and asks it to leave.
type Owner interface {
	// Run runs the tenure and returns once it has ended and the lease is
	// released (or lost). The balancer calls it once, on a goroutine of
	// its own.
	Run()
	// HandOver asks the owner to finish what it fetched and release the
	// lease. It does not block; a second call does nothing.
	HandOver()
	// Abort asks the owner to stop now: its handlers are cancelled, its
	// queued jobs dropped. It does not block; a second call does nothing.
	Abort()
	// Done is closed once Run has returned.
	Done() <-chan struct{}
}

// Config is what a Balancer is built from: the worker's identity, the two
// buckets it balances over, and its collaborators.
type Config[O Owner] struct {
	// ID is the worker's ID: its member key and the holder of the leases
	// it takes. Required; it holds no '.'.
	ID string
	// Partitions is the number of partitions, N. Required.
	Partitions int
	// Members is the members bucket (a lease per live worker); Leases the
	// leases bucket (a lease per owned partition, and stuck marks).
	// Required.
	Members, Leases jetstream.KeyValue
	// LeaseKey names partition p's lease in Leases. Required.
	LeaseKey func(p int) string
	// Lease is how the member entry, the partitions' leases and the stuck
	// marks are taken and kept. Its TTL, the buckets' TTL, paces the
	// balancer too. Lease.Holder defaults to ID; Lease.TTL is required.
	Lease lease.Config
	// NewOwner makes the owner of partition p, whose lease l the balancer
	// has just taken. It must not block; the balancer calls its Run.
	// Required.
	NewOwner func(p int, l *lease.Lease) O
	// Acquired is called once for every lease taken, Stuck once for every
	// stuck mark published. They run on the balancer's goroutines and must
	// not block. Default to doing nothing.
	Acquired, Stuck func()
	// Log receives the balancer's events. Defaults to a logger that
	// discards.
	Log *slog.Logger
}

func (c *Config[O]) check() error {
	switch {
	case c.ID == "":
		return errors.New("balance: Config.ID is required")
	case c.Partitions <= 0:
		return errors.New("balance: Config.Partitions must be > 0")
	case c.Members == nil || c.Leases == nil:
		return errors.New("balance: Config.Members and Config.Leases are required")
	case c.LeaseKey == nil || c.NewOwner == nil:
		return errors.New("balance: Config.LeaseKey and Config.NewOwner are required")
	case c.Lease.TTL <= 0:
		return errors.New("balance: Config.Lease.TTL must be > 0")
	}
	if c.Lease.Holder == "" {
		c.Lease.Holder = c.ID
	}
	if c.Acquired == nil {
		c.Acquired = func() {}
	}
	if c.Stuck == nil {
		c.Stuck = func() {}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

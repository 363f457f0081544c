// Package keylane makes work on a shared resource exclusive without a
// distributed lock.
//
// Every job names a resource key ("sku:123", "seat:A7"). The key is hashed
// onto one of N partitions of a NATS JetStream stream; exactly one worker owns
// a partition at a time, through a lease in a NATS KV bucket, and runs that
// partition's jobs one key at a time, in stream order. A hot key costs no
// retries, no spinning and no lock round trips.
//
// A producer uses a Client:
//
//	c, _ := keylane.NewClient(ctx, nc, keylane.ClientConfig{})
//	res, err := c.Call(ctx, "sku:42", []byte("buy 1"))
//
// A worker process runs a Worker with a Reducer, a pure function from a
// key's state and a job to the new state and the job's result:
//
//	w, _ := keylane.NewWorker(nc, keylane.WorkerConfig{Reducer: r})
//	err := w.Run(ctx, 30*time.Second)
//
// The worker keeps each key's state in a KV bucket and group-commits: it
// reduces a key's queued jobs in memory and stores the outcome with one
// compare-and-set carrying the last job's stream sequence, the fencing
// token and every job's result, so each job takes effect exactly once and a
// hot key costs one write per group, not per job.
//
// Jobs with outside side effects use a Handler instead, which runs one job
// at a time per key; State.Apply gives it the same exactly-once state
// updates (one write per job), and Job.Fence and Job.Seq let it make the
// same check in its own store.
//
// The types live in package github.com/keylane/keylane/jetstream; this
// package re-exports them under the names a user reaches for first. The
// lease protocol is written down in package lease, the mapping of keys to
// partitions in package partition, and classic Redis locks, for code that
// cannot become a job, in package fallback.
package keylane

import (
	"context"

	kjs "github.com/keylane/keylane/jetstream"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

type (
	// Job is one unit of work as a handler sees it.
	Job = kjs.Job
	// Handler runs jobs.
	Handler = kjs.Handler
	// Reducer computes a key's next state and a job's result; the worker
	// group-commits its jobs.
	Reducer = kjs.Reducer
	// ReducerFunc adapts a function to Reducer.
	ReducerFunc = kjs.ReducerFunc
	// CommitObserver, implemented by a Reducer, learns which runs were stored.
	CommitObserver = kjs.CommitObserver
	// HandlerFunc adapts a function to Handler.
	HandlerFunc = kjs.HandlerFunc
	// Mux routes jobs to handlers by type.
	Mux = kjs.Mux
	// Client submits jobs and waits for results.
	Client = kjs.Client
	// ClientConfig configures a Client.
	ClientConfig = kjs.ClientConfig
	// Worker owns partitions and runs their jobs.
	Worker = kjs.Worker
	// WorkerConfig configures a Worker.
	WorkerConfig = kjs.WorkerConfig
	// TopologyConfig names a namespace and how to create it.
	TopologyConfig = kjs.TopologyConfig
	// Stats counts what a worker did.
	Stats = kjs.Stats
	// State keeps per-key state with exactly-once effect.
	State = kjs.State
	// StateEntry is a decoded state entry.
	StateEntry = kjs.StateEntry
	// Request is one job for Client.SubmitMany.
	Request = kjs.Request
	// Submitted is the outcome of one job of SubmitMany.
	Submitted = kjs.Submitted
	// SubmitOpt sets a per-submit option.
	SubmitOpt = kjs.SubmitOpt
	// RemoteError is a handler's error as a caller of Call receives it.
	RemoteError = kjs.RemoteError
	// NoReplyError is Call's error when its context ended first.
	NoReplyError = kjs.NoReplyError
)

// Errors callers check with errors.Is.
var (
	ErrPermanent         = kjs.ErrPermanent
	ErrUnknownType       = kjs.ErrUnknownType
	ErrStaleFence        = kjs.ErrStaleFence
	ErrPartitionMismatch = kjs.ErrPartitionMismatch
	ErrShardsMismatch    = kjs.ErrShardsMismatch
	ErrPayloadTooLarge   = kjs.ErrPayloadTooLarge
	ErrBadJobID          = kjs.ErrBadJobID
	ErrNoReply           = kjs.ErrNoReply
	ErrNoResult          = kjs.ErrNoResult
	ErrNoTopology        = kjs.ErrNoTopology
	ErrDuplicate         = kjs.ErrDuplicate
	ErrGap               = kjs.ErrGap
	ErrEpoch             = kjs.ErrEpoch
)

// NewClient opens the namespace's jobs stream and returns a client.
func NewClient(ctx context.Context, nc *nats.Conn, cfg ClientConfig) (*Client, error) {
	return kjs.NewClient(ctx, nc, cfg)
}

// NewWorker checks cfg and returns a worker that has not started.
func NewWorker(nc *nats.Conn, cfg WorkerConfig) (*Worker, error) { return kjs.NewWorker(nc, cfg) }

// NewState returns a State on a KV bucket, usually Worker.Topology().State.
func NewState(kv jetstream.KeyValue) *State { return kjs.NewState(kv) }

// NewMux returns an empty Mux.
func NewMux() *Mux { return kjs.NewMux() }

// Permanent marks err so that the job is dead-lettered without retries.
func Permanent(err error) error { return kjs.Permanent(err) }

// WithID sets a job's ID, its idempotency key.
func WithID(id string) SubmitOpt { return kjs.WithID(id) }

// WithType sets a job's type, for a Mux.
func WithType(typ string) SubmitOpt { return kjs.WithType(typ) }

// WithHeader adds a header carried to the handler.
func WithHeader(k, v string) SubmitOpt { return kjs.WithHeader(k, v) }

// Setup creates, or opens and checks, a namespace's streams and buckets.
func Setup(ctx context.Context, js jetstream.JetStream, cfg TopologyConfig) (*kjs.Topology, error) {
	return kjs.Setup(ctx, js, cfg)
}

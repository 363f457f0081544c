package keylane

import "github.com/keylane/keylane/internal/core"

// Job is one unit of work as a handler sees it: its ID, key, type,
// payload and headers as submitted, the partition and stream sequence it
// runs at, the fencing token of the lease it runs under, and its attempt.
// Index() is its place in its batch message. Each field's meaning is in
// internal/core, where the engine's rooms share it.
type Job = core.Job

// Handler runs one job. The context is cancelled when the worker loses the
// partition's lease or shuts down hard; a handler that sees it cancelled
// should stop without side effects, since its result will not be acked.
// A returned error is retried in place with backoff; wrap it with Permanent
// to dead-letter at once.
type Handler = core.Handler

// HandlerFunc adapts a function to Handler.
type HandlerFunc = core.HandlerFunc

// Mux routes jobs to handlers by Job.Type. An unknown type is a permanent
// error, so the job is dead-lettered and the caller of Call gets a clear
// error. Register handlers before the worker starts; Mux is not safe for
// concurrent registration.
type Mux = core.Mux

// NewMux returns an empty Mux.
func NewMux() *Mux { return core.NewMux() }

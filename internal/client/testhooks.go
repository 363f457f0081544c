package client

import (
	"context"
	"slices"

	"github.com/nats-io/nats.go"
)

// Hooks for tests of package keylane, which drive a Client through its
// API and look inside it here. None is for production use.

// Config returns the configuration c was built from.
func (c *Client) Config() Config { return c.cfg }

// Queued returns how many jobs wait in partition p's batcher.
func (c *Client) Queued(p int) int { return c.wire.Queued(p) }

// SetBeforeBatch makes f see every batch message of two jobs or more just
// before its first publish. Set it before any job is sent.
func (c *Client) SetBeforeBatch(f func(*nats.Msg)) { c.beforeBatch = f }

// SetBeforeAlone sets the hook that sees each batch of one Client.alone builds.
func (c *Client) SetBeforeAlone(f func(*nats.Msg)) { c.beforeAlone = f }

// SetPartitionsHeader makes c send v as its Keylane-Partitions header (a
// client that routes with a stale partition count). Set it before any
// job is sent.
func (c *Client) SetPartitionsHeader(v string) { c.nHeader = []string{v} }

// Waiting returns c's inbox ("" before its first Call) and the reply
// tokens of the Calls waiting now.
func (c *Client) Waiting() (inbox string, tokens []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for tok := range c.waiters {
		tokens = append(tokens, tok)
	}
	slices.Sort(tokens)
	return c.inbox, tokens
}

// Message is the job message Submit (reply "") or Call would send for r,
// before any batching.
func (c *Client) Message(r *Request, reply string) (*nats.Msg, error) { return c.message(r, reply) }

// BatchMessage is the batch message that carries ms, job messages of
// partition p (Message's).
func (c *Client) BatchMessage(p int, ms []*nats.Msg) (*nats.Msg, error) {
	return c.batchMessage(p, ms)
}

// AwaitOutcome waits for job id's outcome kept in the results bucket, as
// a Call whose reply was lost does.
func (c *Client) AwaitOutcome(ctx context.Context, id string) ([]byte, error) {
	return c.awaitOutcome(ctx, id)
}

// OutcomePoll is how often AwaitOutcome reads the results bucket besides
// watching it.
const OutcomePoll = outcomePoll

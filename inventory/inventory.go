// Package inventory is keylane's built-in handler for the use case it was
// made for: stock of SKUs that many buyers deduct at once. Stock lives in a
// keylane State, so every deduction is applied exactly once and a sale can
// never oversell, whatever the workers, crashes or redeliveries.
//
// Jobs are small text commands, keyed by SKU:
//
//	set N       set the stock to N          -> "ok N"
//	restock N   add N                       -> "ok <stock>"; a permanent
//	            error if the stock would pass the largest int64
//	buy N       deduct N if that many left  -> "sold <left>" or "soldout <left>"
//	get         read the stock              -> "stock N"
//	fail        always fails, retriably: a poison job for trying out
//	            retries and dead-lettering
//
// Anything else is a permanent error: the job is dead-lettered at once.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/keylane/keylane"
)

// ErrBadCommand is returned (permanently) for a job that is not a command
// of this handler.
var ErrBadCommand = errors.New("inventory: bad command")

// ErrOverflow is returned (permanently) for a restock that would take the
// stock past the largest int64.
var ErrOverflow = errors.New("inventory: stock overflow")

// ErrPoison is the (retriable) error of the "fail" command.
var ErrPoison = errors.New("inventory: poison job")

// Handler applies inventory commands. It is safe for concurrent use.
type Handler struct {
	// State stores the stock when the handler runs as a Handler. A worker
	// running it as a Reducer keeps the stock itself and ignores State.
	State *keylane.State
}

// Command is a parsed job payload.
type Command struct {
	Op string
	N  int64
}

// Parse reads a job payload.
func Parse(payload []byte) (Command, error) {
	f := strings.Fields(string(payload))
	if len(f) == 0 {
		return Command{}, fmt.Errorf("%w: empty", ErrBadCommand)
	}
	c := Command{Op: f[0]}
	switch c.Op {
	case "get", "fail":
		if len(f) != 1 {
			return c, fmt.Errorf("%w: %s takes no argument", ErrBadCommand, c.Op)
		}
		return c, nil
	case "set", "restock", "buy":
		if len(f) != 2 {
			return c, fmt.Errorf("%w: %s takes one number", ErrBadCommand, c.Op)
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || n < 0 || (c.Op == "buy" && n == 0) {
			return c, fmt.Errorf("%w: %q is not a valid quantity", ErrBadCommand, f[1])
		}
		c.N = n
		return c, nil
	}
	return c, fmt.Errorf("%w: unknown operation %q", ErrBadCommand, c.Op)
}

// Reduce implements keylane's Reducer, the fast path: the worker keeps the
// stock and group-commits a SKU's queued purchases with one state write.
func (h *Handler) Reduce(ctx context.Context, job keylane.Job, cur []byte) ([]byte, []byte, error) {
	cmd, err := Parse(job.Payload)
	if err != nil {
		return nil, nil, keylane.Permanent(err)
	}
	return step(cmd, cur)
}

// Handle implements keylane's Handler: the same commands, each applied
// with its own state write through State.Apply.
func (h *Handler) Handle(ctx context.Context, job keylane.Job) ([]byte, error) {
	cmd, err := Parse(job.Payload)
	if err != nil {
		return nil, keylane.Permanent(err)
	}
	if cmd.Op == "get" {
		e, err := h.State.Get(ctx, job.Key)
		if err != nil {
			return nil, err
		}
		return []byte("stock " + strconv.FormatInt(decode(e.Value), 10)), nil
	}
	return h.State.Apply(ctx, job, func(cur []byte) ([]byte, []byte, error) {
		return step(cmd, cur)
	})
}

// step applies one command to the stock.
func step(cmd Command, cur []byte) ([]byte, []byte, error) {
	if cmd.Op == "fail" {
		return nil, nil, ErrPoison
	}
	stock := decode(cur)
	var out []byte
	switch cmd.Op {
	case "get":
		return cur, append([]byte("stock "), strconv.FormatInt(stock, 10)...), nil
	case "set":
		stock = cmd.N
		out = append([]byte("ok "), strconv.FormatInt(stock, 10)...)
	case "restock":
		if stock > 0 && cmd.N > math.MaxInt64-stock {
			return nil, nil, keylane.Permanent(fmt.Errorf("%w: restock %d onto %d", ErrOverflow, cmd.N, stock))
		}
		stock += cmd.N
		out = append([]byte("ok "), strconv.FormatInt(stock, 10)...)
	case "buy":
		if stock >= cmd.N {
			stock -= cmd.N
			out = append([]byte("sold "), strconv.FormatInt(stock, 10)...)
		} else {
			out = append([]byte("soldout "), strconv.FormatInt(stock, 10)...)
		}
	}
	return encode(stock), out, nil
}

func decode(b []byte) int64 {
	n, _ := strconv.ParseInt(string(b), 10, 64)
	return n
}

func encode(n int64) []byte { return strconv.AppendInt(nil, n, 10) }

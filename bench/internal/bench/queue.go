package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// queue carries inventory commands ("set N", "buy 1", "get") to whoever
// keeps the stock behind a stream: keylane's workers or the raw consumer.
type queue interface {
	// call stores one command and waits for its reply.
	call(ctx context.Context, key string, payload []byte, id string) ([]byte, error)
	// submit stores commands without waiting for them to run.
	submit(ctx context.Context, keys []string, payload []byte, ids []string) error
	// backlog is how many stored messages have not yet run: zero when
	// the queue has drained. Polled every 2ms while a fire-and-forget
	// sale settles, so it must be cheap (keylane: Client.Stored, stream
	// info only; Client.Backlog reads the batch messages to count their
	// jobs, a load that slowed the very sale it waited for).
	backlog(ctx context.Context) (uint64, error)
}

// queueShop sells through a queue.
type queueShop struct{ q queue }

var buyOne = []byte("buy 1")

func (s queueShop) stock(ctx context.Context, skus []string, n int64) error {
	set := []byte("set " + strconv.FormatInt(n, 10))
	for lo := 0; lo < len(skus); lo += submitChunk {
		if err := s.q.submit(ctx, skus[lo:min(lo+submitChunk, len(skus))], set, nil); err != nil {
			return err
		}
	}
	return settleStream(ctx, s.q.backlog)
}

func (s queueShop) buy(ctx context.Context, sku, id string) (bool, int, error) {
	res, err := s.q.call(ctx, sku, buyOne, id)
	switch {
	case err != nil:
		return false, 0, err
	case strings.HasPrefix(string(res), "sold "):
		return true, 0, nil
	case strings.HasPrefix(string(res), "soldout "):
		return false, 0, nil
	}
	return false, 0, fmt.Errorf("unexpected reply %q", res)
}

func (s queueShop) submit(ctx context.Context, skus, ids []string) error {
	return s.q.submit(ctx, skus, buyOne, ids)
}

func (s queueShop) settle(ctx context.Context) error { return settleStream(ctx, s.q.backlog) }

// levels asks for every SKU's stock with "get", 64 at a time.
func (s queueShop) levels(ctx context.Context, skus []string) ([]int64, error) {
	out := make([]int64, len(skus))
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range min(64, len(skus)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(skus); i = int(next.Add(1) - 1) {
				n, err := s.get(ctx, skus[i])
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				out[i] = n
			}
		})
	}
	wg.Wait()
	return out, firstErr
}

func (s queueShop) get(ctx context.Context, sku string) (int64, error) {
	res, err := s.q.call(ctx, sku, []byte("get"), "")
	if err != nil {
		return 0, err
	}
	n, ok := strings.CutPrefix(string(res), "stock ")
	if !ok {
		return 0, fmt.Errorf("unexpected reply to get: %q", res)
	}
	return strconv.ParseInt(n, 10, 64)
}

package e2e

import (
	"context"
	"errors"
	"fmt"
	"github.com/keylane/keylane/wire"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go/jetstream"
)

// callResult is the outcome of a Call made on another goroutine.
type callResult struct {
	res string
	err error
	at  time.Time
}

func (c *cluster) callAsync(key, payload string, opts ...keylane.SubmitOpt) <-chan callResult {
	ch := make(chan callResult, 1)
	go func() {
		res, err := c.call(key, payload, opts...)
		ch <- callResult{res: res, err: err, at: time.Now()}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan callResult, what string) callResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(45 * time.Second):
		t.Fatalf("no result for %s", what)
		return callResult{}
	}
}

// TestPoisonJob runs jobs that always fail on one key (--max-deliver 3).
// Each is retried in place with backoff, then dead-lettered with its error,
// attempts and worker; the caller gets a RemoteError saying so. Meanwhile
// other keys, in the poison key's partition and elsewhere, keep flowing,
// and a job on the poison key submitted after the poison runs only after it.
func TestPoisonJob(t *testing.T) {
	c := startCluster(t, "e2e-poison", 3, "--max-deliver", "3")
	const poisonKey = "poison:0"
	pp := partition.Of(poisonKey, partitions)

	// Other SKUs: half share the poison key's partition, half do not.
	var same, other []string
	for i := 0; len(same) < 4 || len(other) < 4; i++ {
		k := fmt.Sprintf("sku:%d", i)
		if partition.Of(k, partitions) == pp {
			if len(same) < 4 {
				same = append(same, k)
			}
		} else if len(other) < 4 {
			other = append(other, k)
		}
	}
	skus := append(slices.Clone(same), other...)
	initial := make([]int64, len(skus))
	for i := range initial {
		initial[i] = 1000
	}
	c.setStock(append(skus, poisonKey), append(slices.Clone(initial), 10))

	// A chain of poison jobs on the key keeps it blocked for a while (each
	// takes three attempts with 50ms and 100ms of backoff between): long
	// enough to see the other keys' purchases complete meanwhile. Four
	// (0.7s) were not always enough on a loaded machine: the 500 purchases
	// took 701ms there, 1.3s on a busier one (2026-11-22); twelve block the
	// key for about 2s, and 200 purchases show the flow as well.
	const chain, others = 12, 200
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 1; i < chain; i++ {
		if _, err := c.client.Submit(ctx, poisonKey, []byte("fail"), keylane.WithID(fmt.Sprintf("poison-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	lastPoison := fmt.Sprintf("poison-%d", chain)
	submitted := time.Now()
	poisonCh := c.callAsync(poisonKey, "fail", keylane.WithID(lastPoison))
	// The purchase on the same key must be stored after the poison job.
	c.waitStored(wire.BatchSubject(c.ns, pp), lastPoison, 10*time.Second)
	afterCh := c.callAsync(poisonKey, "buy 1", keylane.WithID("after-poison"))

	b := c.startBuyers(32, skus, "poison-others", others, func(i int) int { return i % len(skus) })
	ps := b.wait()
	poison := receive(t, poisonCh, lastPoison)
	after := receive(t, afterCh, "after-poison")

	var re *keylane.RemoteError
	if !errors.As(poison.err, &re) {
		t.Fatalf("poison job: got %q, %v; want a *RemoteError", poison.res, poison.err)
	}
	if !re.DeadLettered || !errors.Is(poison.err, keylane.ErrPermanent) || !strings.Contains(re.Message, "poison") {
		t.Errorf("poison job: RemoteError %+v, want dead-lettered and permanent with the handler's error", re)
	}
	t.Logf("poison job %s answered %s after submit: %v", lastPoison, poison.at.Sub(submitted).Round(time.Millisecond), poison.err)

	demand, sold := checkPurchases(t, ps, len(skus))
	var lastOther time.Time
	for _, p := range ps {
		if p.end.After(lastOther) {
			lastOther = p.end
		}
	}
	t.Logf("%d purchases on other keys (4 of them in the poison key's partition %d) done %s after the poison submit, %s before its reply",
		others, pp, lastOther.Sub(submitted).Round(time.Millisecond), poison.at.Sub(lastOther).Round(time.Millisecond))
	if !lastOther.Before(poison.at) {
		t.Errorf("purchases on other keys finished %s after the poison job's reply: they were held up", lastOther.Sub(poison.at))
	}
	checkStock(t, c, skus, initial, demand, sold)

	if after.err != nil || after.res != "sold 9" {
		t.Errorf("purchase after the poison job: %q, %v; want \"sold 9\"", after.res, after.err)
	}
	// The two replies reach two goroutines of this process, and which one
	// a loaded machine schedules first says nothing about the worker: the
	// order is checked where it happens, in the workers' trace below.

	workers := c.live()
	dead := c.deadLetters()
	for i := 1; i <= chain; i++ {
		id := fmt.Sprintf("poison-%d", i)
		i := slices.IndexFunc(dead, func(m *jetstream.RawStreamMsg) bool { return wire.JobIDOfDead(m.Header) == id })
		if i < 0 {
			t.Errorf("%s is not on the dead-letter stream %s", id, c.names.Dead())
			continue
		}
		h := dead[i].Header
		if e := h.Get(keylane.HeaderError); !strings.Contains(e, "poison") {
			t.Errorf("%s: %s = %q, want the handler's error", id, keylane.HeaderError, e)
		}
		if a := h.Get(keylane.HeaderAttempts); a != "3" {
			t.Errorf("%s: %s = %q, want 3", id, keylane.HeaderAttempts, a)
		}
		if w := h.Get(keylane.HeaderWorker); !slices.Contains(workers, w) {
			t.Errorf("%s: %s = %q, want one of %v", id, keylane.HeaderWorker, w, workers)
		}
		if k := h.Get(keylane.HeaderKey); k != poisonKey {
			t.Errorf("%s: %s = %q, want %q", id, keylane.HeaderKey, k, poisonKey)
		}
		if string(dead[i].Data) != "fail" {
			t.Errorf("%s: dead letter body %q, want the original job", id, dead[i].Data)
		}
	}

	// The trace: three attempts per poison job, and the purchase behind
	// them on the same key started only after the last attempt ended.
	c.stopGraceful(15 * time.Second)
	runs := readTraces(t, c.traceFiles())
	var poisonEnd int64
	attempts := map[string]int{}
	for _, r := range runs {
		if strings.HasPrefix(r.Job, "poison-") && r.Key == poisonKey {
			attempts[r.Job]++
			poisonEnd = max(poisonEnd, r.End)
		}
	}
	for i := 1; i <= chain; i++ {
		if n := attempts[fmt.Sprintf("poison-%d", i)]; n != 3 {
			t.Errorf("poison-%d ran %d times, want 3", i, n)
		}
	}
	for _, r := range runs {
		if r.Job == "after-poison" && r.Start < poisonEnd {
			t.Errorf("after-poison started %s before the poison jobs' last attempt ended", time.Duration(poisonEnd-r.Start))
		}
	}
	checkTrace(t, runs, ps, traceRules{})
}

// waitStored polls until the last batch message stored on subject (a
// partition's batch subject) carries job ID id.
func (c *cluster) waitStored(subject, id string, timeout time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := c.js.Stream(ctx, c.names.Jobs())
	if err != nil {
		c.t.Fatal(err)
	}
	for {
		// Every job travels in a batch message: the partition's last
		// one holds it once stored (nothing else of its partition is
		// submitted meanwhile).
		m, err := s.GetLastMsgForSubject(ctx, subject)
		if err == nil {
			jobs, derr := wire.DecodeBatch(m.Data)
			for _, j := range jobs {
				if derr == nil && j.ID == id {
					return
				}
			}
		}
		if ctx.Err() != nil {
			c.t.Fatalf("job %s not stored on %s within %s (last error %v)", id, subject, timeout, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

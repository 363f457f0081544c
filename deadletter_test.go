package keylane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/testwait"
)

// poisonCounter counts a key's jobs and refuses, permanently, any job whose
// payload starts with "poison", quoting the whole payload in its error.
var poisonCounter = ReducerFunc(func(_ context.Context, job Job, cur []byte) ([]byte, []byte, error) {
	if bytes.HasPrefix(job.Payload, []byte("poison")) {
		return nil, nil, Permanent(fmt.Errorf("refused %q", job.Payload))
	}
	n, _ := strconv.Atoi(string(cur))
	v := []byte(strconv.Itoa(n + 1))
	return v, v, nil
})

// TestDeadLetterTooLargeStillFits: the error text quotes a payload near
// max_payload, which would push the dead letter over it. The dead letter
// must still be written (bounded), and the poison job's caller must get
// the dead-letter error, never a success.
func TestDeadLetterTooLargeStillFits(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	w := e.worker("w", nil, func(c *WorkerConfig) { c.Handler, c.Reducer, c.AckWait = nil, poisonCounter, time.Second })
	e.waitOwned(w)

	big := append([]byte("poison"), bytes.Repeat([]byte("x"), int(e.nc.MaxPayload())-DeadLetterReserve-512)...)
	poison := make(chan error, 1)
	go func() {
		_, err := e.client.Call(ctx(t), "k", big)
		poison <- err
	}()
	testwait.Eventually(t, 10*time.Second, "the poison job ran", func() bool { return w.Stats().Failed > 0 })
	if res, err := e.client.Call(ctx(t), "k", nil); err != nil || string(res) != "1" {
		t.Fatalf("next job = %q, %v; want 1", res, err)
	}
	err := <-poison
	var re *RemoteError
	if !errors.As(err, &re) || !re.DeadLettered || !strings.Contains(re.Message, "refused") {
		t.Fatalf("poison call = %v; want a dead-lettered RemoteError saying why", err)
	}
	dead := e.deadLetters()
	if len(dead) != 1 || len(dead[0].Header.Get(HeaderError)) > deadErrorMax+8 || !strings.Contains(dead[0].Header.Get(HeaderError), "refused") {
		t.Fatalf("%d dead letters; want 1 with a bounded error", len(dead))
	}
	if e.streamMsgs(e.topo.Names.Jobs()) != 0 {
		t.Fatal("jobs left in the stream")
	}
}

// TestDeadLetterUnwritableHoldsTheLane: the dead-letter stream is missing.
// The poison job must stay in its lane, unacked, while later jobs of its key
// wait; the failure is counted; once the stream is back the job is
// dead-lettered and the key moves on, in order.
func TestDeadLetterUnwritableHoldsTheLane(t *testing.T) {
	e := newEnv(t, TopologyConfig{Partitions: 1})
	w := e.worker("w", nil, func(c *WorkerConfig) {
		c.Handler, c.Reducer, c.AckWait = nil, poisonCounter, time.Second
		c.Backoff = func(int) time.Duration { return 50 * time.Millisecond }
	})
	e.waitOwned(w)
	if err := e.js.DeleteStream(ctx(t), e.topo.Names.Dead()); err != nil {
		t.Fatal(err)
	}
	poison := make(chan error, 1)
	go func() {
		_, err := e.client.Call(ctx(t), "k", []byte("poison"))
		poison <- err
	}()
	testwait.Eventually(t, 10*time.Second, "a failed dead-letter write counted", func() bool { return w.Stats().DeadLetterErrors > 0 })
	later := make(chan string, 1)
	go func() {
		res, err := e.client.Call(ctx(t), "k", nil)
		if err != nil {
			res = []byte(err.Error())
		}
		later <- string(res)
	}()
	// The later job must not run while the poison job is unsettled. Give it
	// a few dead-letter retries to overtake, which it must not.
	testwait.Eventually(t, 10*time.Second, "more dead-letter retries", func() bool { return w.Stats().DeadLetterErrors > 3 })
	select {
	case r := <-later:
		t.Fatalf("a later job of the key ran (%q) while the poison job was neither applied nor dead-lettered", r)
	case err := <-poison:
		t.Fatalf("poison call returned %v while its dead letter could not be written", err)
	default:
	}
	if _, err := Setup(ctx(t), e.js, e.topo.Config); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-poison:
		var re *RemoteError
		if !errors.As(err, &re) || !re.DeadLettered {
			t.Fatalf("poison call = %v; want a dead-lettered RemoteError", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("poison call never answered after the dead-letter stream came back")
	}
	select {
	case r := <-later:
		if r != "1" {
			t.Fatalf("later job = %q; want 1", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("later job never ran")
	}
	if d := e.deadLetters(); len(d) != 1 || !strings.Contains(d[0].Header.Get(HeaderError), "poison") {
		t.Fatalf("dead letters: %d", len(d))
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeadCommand: keylane dead list shows a dead-lettered job, show
// prints it, redrive --all runs it again once fixed, purge empties the
// stream; bad arguments are refused.
func TestDeadCommand(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var broken atomic.Bool
	broken.Store(true)
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "dl", Partitions: 2, LeaseTTL: time.Second},
		Handler: keylane.HandlerFunc(func(_ context.Context, job keylane.Job) ([]byte, error) {
			if broken.Load() {
				return nil, keylane.Permanent(errors.New("card declined"))
			}
			return []byte("paid"), nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "dl"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Call(ctx, "order:1", []byte("42 EUR"), keylane.WithID("pay-1")); err == nil {
		t.Fatal("the payment succeeded while broken")
	}
	url := srv.ClientURL()
	var out bytes.Buffer
	testwait.Eventually(t, 10*time.Second, "dead list shows pay-1", func() bool {
		out.Reset()
		return run(ctx, []string{"dead", "list", "--nats", url, "--namespace", "dl"}, &out, &out) == nil && strings.Contains(out.String(), "pay-1") && strings.Contains(out.String(), "card declined")
	})
	out.Reset()
	if err := run(ctx, []string{"dead", "show", "--nats", url, "--namespace", "dl", "1"}, &out, &out); err != nil || !strings.Contains(out.String(), `"42 EUR"`) {
		t.Fatalf("dead show: %v\n%s", err, out.String())
	}
	broken.Store(false)
	out.Reset()
	var bars bytes.Buffer
	if err := run(ctx, []string{"dead", "redrive", "--nats", url, "--namespace", "dl", "--all", "--progress", "--yes"}, &out, &bars); err != nil || !strings.Contains(out.String(), "redriven as") {
		t.Fatalf("dead redrive --all: %v\n%s", err, out.String())
	}
	if final := bars.String()[strings.LastIndex(bars.String(), "\n\x1b[")+1:]; !strings.Contains(final, "redrive") || !strings.Contains(final, "1 / 1") || !strings.Contains(final, "done") {
		t.Fatalf("dead redrive --all --progress: the bar's final state is %q", final)
	}
	testwait.Eventually(t, 10*time.Second, "pay-1 answers with the redriven outcome", func() bool {
		res, err := c.Result(ctx, "pay-1")
		return err == nil && string(res) == "paid"
	})
	js, _ := jetstream.New(nc)
	if dls, err := keylane.DeadLetters(ctx, js, "dl", 0, 10); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after redrive: %+v, %v", dls, err)
	}
	out.Reset()
	if err := run(ctx, []string{"dead", "purge", "--all", "--nats", url, "--namespace", "dl"}, &out, &out); err != nil || !strings.Contains(out.String(), "nothing to purge") {
		t.Fatalf("dead purge: %v\n%s", err, out.String())
	}
	for _, args := range [][]string{{"dead"}, {"dead", "nope", "--nats", url}, {"dead", "show", "--nats", url, "--namespace", "dl"}, {"dead", "show", "--nats", url, "--namespace", "dl", "x"}, {"dead", "list", "--limit", "0", "--nats", url}} {
		if err := run(ctx, args, &out, &out); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// TestDeadCommandsHonourTheirFilters: redrive and purge act on exactly
// the dead letters their arguments and --from/--limit select, print them
// first and act only with --yes (--dry-run only prints); a filter that
// does not apply is refused, and flags work after the arguments.
func TestDeadCommandsHonourTheirFilters(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var broken atomic.Bool
	broken.Store(true)
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "dl", Partitions: 2, LeaseTTL: time.Second},
		Handler: keylane.HandlerFunc(func(_ context.Context, job keylane.Job) ([]byte, error) {
			if broken.Load() {
				return nil, keylane.Permanent(errors.New("card declined"))
			}
			return []byte("paid"), nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "dl"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	js, _ := jetstream.New(nc)
	const n = 8
	for i := range n {
		if _, err := c.Submit(ctx, "order:"+strconv.Itoa(i), []byte("x"), keylane.WithID("pay-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	seqs := func() []uint64 {
		t.Helper()
		dls, err := keylane.DeadLetters(ctx, js, "dl", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		var s []uint64
		for _, d := range dls {
			s = append(s, d.Seq)
		}
		return s
	}
	testwait.Eventually(t, 20*time.Second, "8 dead letters", func() bool { return len(seqs()) == n })
	url := srv.ClientURL()
	dead := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append(append([]string{"dead"}, args...), "--nats", url, "--namespace", "dl"), &out, &out)
		return out.String(), err
	}
	want := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	check := func(what string) {
		t.Helper()
		if got := seqs(); !slices.Equal(got, want) {
			t.Fatalf("after %s: dead letters %v, want %v", what, got, want)
		}
	}

	// Without --yes nothing happens: the plan is printed.
	out, err := dead("purge", "--from", "3", "--limit", "1")
	check("purge --from 3 --limit 1 without --yes")
	if err == nil || !strings.Contains(err.Error(), "--yes") || !strings.Contains(out, "will purge 1 dead letters") {
		t.Fatalf("purge without --yes: %v\n%s", err, out)
	}
	if out, err := dead("purge", "2", "--dry-run"); err != nil || !strings.Contains(out, "will purge 1 dead letters") || !strings.Contains(out, "card declined") {
		t.Fatalf("purge 2 --dry-run: %v\n%s", err, out)
	}
	check("purge 2 --dry-run")

	// With --yes, exactly the selected ones go.
	if out, err := dead("purge", "--from", "3", "--limit", "1", "--yes"); err != nil {
		t.Fatalf("purge --from 3 --limit 1 --yes: %v\n%s", err, out)
	}
	want = []uint64{1, 2, 4, 5, 6, 7, 8}
	check("purge --from 3 --limit 1 --yes")
	if out, err := dead("purge", "2", "--yes"); err != nil {
		t.Fatalf("purge 2 --yes: %v\n%s", err, out)
	}
	want = []uint64{1, 4, 5, 6, 7, 8}
	check("purge 2 --yes")

	broken.Store(false)
	if out, err := dead("redrive", "--all", "--from", "5", "--limit", "2", "--yes"); err != nil || strings.Count(out, "redriven as") != 2 {
		t.Fatalf("redrive --all --from 5 --limit 2 --yes: %v\n%s", err, out)
	}
	want = []uint64{1, 4, 7, 8}
	check("redrive --all --from 5 --limit 2 --yes")

	// Refused: a sequence with a selection, a filter that does not apply,
	// no selection at all, --yes with --dry-run.
	for _, args := range [][]string{
		{"purge", "4", "--from", "1"},
		{"redrive", "4", "--all"},
		{"purge"},
		{"redrive"},
		{"purge", "--all", "--yes", "--dry-run"},
		{"show", "1", "--limit", "1"},
		{"list", "4"},
	} {
		if out, err := dead(args...); err == nil {
			t.Errorf("dead %q succeeded:\n%s", args, out)
		}
	}
	check("the refused commands")

	// Flags after the sequence.
	if out, err := dead("show", "1", "--json"); err != nil || !strings.Contains(out, `"Seq":1,`) {
		t.Fatalf("dead show 1 --json: %v\n%s", err, out)
	}
	if out, err := dead("purge", "--all", "--yes"); err != nil || !strings.Contains(out, "purged 4 dead letters") {
		t.Fatalf("purge --all --yes: %v\n%s", err, out)
	}
	want = nil
	check("purge --all --yes")
}

// TestDeadRedriveOfAWholeBatch: keylane dead redrive of a batch message
// dead-lettered whole (fetched by a worker that does not read batches)
// shows, with --dry-run, each job it would submit (its key and new ID)
// and does nothing; with --yes it submits each job, which runs on its
// key's partition and answers under its batch ID too, and deletes the
// dead letter. A batch whose body does not decode is refused ("this dead
// letter is a malformed batch: nothing to redrive") and stays. Before,
// the redrive failed with "partition: key is empty".
func TestDeadRedriveOfAWholeBatch(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	ran := map[string]int{} // payload → partition it ran on
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "dlb", Partitions: 2, LeaseTTL: time.Second},
		Handler: keylane.HandlerFunc(func(_ context.Context, job keylane.Job) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			if _, twice := ran[string(job.Payload)]; twice {
				return nil, errors.New("ran twice")
			}
			ran[string(job.Payload)] = job.Partition
			return []byte("done " + string(job.Payload)), nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "dlb"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	js, _ := jetstream.New(nc)
	var keys [2]string // a key of each partition
	for i := 0; keys[0] == "" || keys[1] == ""; i++ {
		k := "seat:" + strconv.Itoa(i)
		keys[partition.Of(k, 2)] = k
	}
	// Every worker reads batches: a batch is dead-lettered whole for a
	// header that breaks the rules (here another partition count, as a
	// client from before a repartition sends) or a body that does not
	// decode.
	publish := func(p int, batchID string, body []byte, jobs int) {
		t.Helper()
		m := &nats.Msg{Subject: wire.BatchSubject("dlb", p), Data: body, Header: nats.Header{
			keylane.HeaderJobID: {batchID}, wire.HeaderBatch: {"1"}, keylane.HeaderPartitions: {"3"}, wire.HeaderBatchJobs: {strconv.Itoa(jobs)},
		}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	const batchID, garbledID = "BatchOfTwoJobsZZZZZZZZ", "GarbledBatchZZZZZZZZZZ"
	body, err := wire.EncodeBatch([]wire.BatchJob{
		{Key: keys[0], ID: wire.BatchedJobID(batchID, 0), Payload: []byte("j0")},
		{Key: keys[1], ID: wire.BatchedJobID(batchID, 1), Payload: []byte("j1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	publish(0, batchID, body, 2)
	publish(1, garbledID, []byte("KLB\x01\x02garbled"), 2)
	var dls []keylane.DeadLetter
	testwait.Eventually(t, 10*time.Second, "both batches dead-lettered whole", func() bool {
		dls, err = keylane.DeadLetters(ctx, js, "dlb", 0, 10)
		return err == nil && len(dls) == 2
	})
	if dls[0].JobID != batchID { // (two partitions: either may come first)
		dls[0], dls[1] = dls[1], dls[0]
	}
	seq, garbled := strconv.FormatUint(dls[0].Seq, 10), strconv.FormatUint(dls[1].Seq, 10)
	url := srv.ClientURL()
	dead := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append(append([]string{"dead"}, args...), "--nats", url, "--namespace", "dlb"), &out, &out)
		return out.String(), err
	}

	out, err := dead("redrive", seq, "--dry-run")
	if err != nil || !strings.Contains(out, "a batch of 2 jobs") || !strings.Contains(out, "dry run: nothing done") ||
		!strings.Contains(out, "key "+keys[0]) || !strings.Contains(out, "key "+keys[1]) || !strings.Contains(out, "as "+wire.BatchedJobID(batchID, 1)+".redrive-") {
		t.Fatalf("dead redrive %s --dry-run: %v\n%s", seq, err, out)
	}
	if dls, err := keylane.DeadLetters(ctx, js, "dlb", 0, 10); err != nil || len(dls) != 2 {
		t.Fatalf("dead letters after --dry-run: %d, %v", len(dls), err)
	}
	if out, err := dead("redrive", seq, "--yes"); err != nil || !strings.Contains(out, "(batch "+batchID+", 2 jobs) redriven as:") || strings.Count(out, ".redrive-") != 4 {
		t.Fatalf("dead redrive %s --yes: %v\n%s", seq, err, out)
	}
	for i, key := range keys {
		testwait.Eventually(t, 10*time.Second, "job "+strconv.Itoa(i)+" answers under its batch ID", func() bool {
			res, err := c.Result(ctx, wire.BatchedJobID(batchID, i))
			return err == nil && string(res) == "done j"+strconv.Itoa(i)
		})
		mu.Lock()
		p := ran["j"+strconv.Itoa(i)]
		mu.Unlock()
		if p != partition.Of(key, 2) {
			t.Fatalf("job %d of key %s ran on partition %d", i, key, p)
		}
	}

	out, err = dead("redrive", garbled, "--yes")
	if err == nil || !strings.Contains(out, "this dead letter is a malformed batch: nothing to redrive") {
		t.Fatalf("dead redrive of a garbled batch: %v\n%s", err, out)
	}
	if dls, err := keylane.DeadLetters(ctx, js, "dlb", 0, 10); err != nil || len(dls) != 1 || dls[0].JobID != garbledID {
		t.Fatalf("dead letters at the end: %+v, %v; want the garbled batch's only", dls, err)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeadSelection: dead letters are listed newest first, a page at a
// time, and selected by key, error, age and job ID for list, show,
// redrive and purge; a destructive command without a selection is
// refused (exit 2) unless --all, acts on exactly what it selects, and an
// unknown sequence or job says so (exit 3), never a raw server error.
func TestDeadSelection(t *testing.T) {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var broken atomic.Bool
	broken.Store(true)
	w, err := keylane.NewWorker(nc, keylane.WorkerConfig{
		Topology: keylane.TopologyConfig{Namespace: "sel", Partitions: 2, LeaseTTL: time.Second},
		Handler: keylane.HandlerFunc(func(_ context.Context, job keylane.Job) ([]byte, error) {
			if broken.Load() {
				return nil, keylane.Permanent(errors.New(string(job.Payload)))
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
	c, err := keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "sel"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	js, _ := jetstream.New(nc)
	jobs := []struct{ id, key, why string }{
		{"pay-1", "order:1", "card declined"},
		{"pay-2", "order:2", "address invalid"},
		{"pay-3", "order:1", "card declined"},
		{"pay-4", "order:3", "Card DECLINED by bank"},
		{"pay-5", "order:2", "card declined"},
	}
	var third time.Time
	for i, j := range jobs {
		if i == 3 {
			// An age between the third dead letter and the fourth.
			testwait.Eventually(t, 10*time.Second, "the third dead letter is 2s old", func() bool { return time.Since(third) > 2*time.Second })
		}
		if _, err := c.Call(ctx, j.key, []byte(j.why), keylane.WithID(j.id)); err == nil {
			t.Fatalf("%s succeeded while broken", j.id)
		}
		testwait.Eventually(t, 10*time.Second, j.id+" dead-lettered", func() bool {
			dls, err := keylane.DeadLetters(ctx, js, "sel", 0, 10)
			if err != nil || len(dls) != i+1 {
				return false
			}
			third = dls[min(2, i)].Time
			return true
		})
	}
	url := srv.ClientURL()
	dead := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		err := run(ctx, append(append([]string{"dead"}, args...), "--nats", url, "--namespace", "sel"), &out, &errOut)
		return out.String() + errOut.String() + errText(err), exitCode(err)
	}
	list := func(args ...string) []uint64 {
		t.Helper()
		var out, errOut bytes.Buffer
		err := run(ctx, append([]string{"dead", "list", "--json", "--nats", url, "--namespace", "sel"}, args...), &out, &errOut)
		var dls []keylane.DeadLetter
		if err != nil || json.Unmarshal(out.Bytes(), &dls) != nil || dls == nil {
			t.Fatalf("dead list --json %q: %v, want a JSON array on stdout:\n%s\n%s", args, err, out.String(), errOut.String())
		}
		seqs := []uint64{}
		for _, d := range dls {
			seqs = append(seqs, d.Seq)
		}
		return seqs
	}
	for _, tc := range []struct {
		args []string
		want []uint64
	}{
		{nil, []uint64{5, 4, 3, 2, 1}},
		{[]string{"--limit", "2"}, []uint64{5, 4}},
		{[]string{"--limit", "2", "--before", "4"}, []uint64{3, 2}},
		{[]string{"--before", "2"}, []uint64{1}},
		{[]string{"--key", "order:1"}, []uint64{3, 1}},
		{[]string{"--error", "declined"}, []uint64{5, 4, 3, 1}},
		{[]string{"--error", "address", "--key", "order:2"}, []uint64{2}},
		{[]string{"--job", "pay-4"}, []uint64{4}},
		{[]string{"--key", "order:9"}, []uint64{}},
		{[]string{"--older-than", "24h"}, []uint64{}},
	} {
		if got := list(tc.args...); !slices.Equal(got, tc.want) {
			t.Errorf("dead list %q: sequences %v, want %v", tc.args, got, tc.want)
		}
	}
	// An age a second below the third dead letter's (the fourth is a
	// second younger still), as the command's clock reads it: computed
	// right before each command, which has a second to read its own.
	mid := func() string { return (time.Since(third) - time.Second).Round(time.Millisecond).String() }
	if got := list("--older-than", mid()); !slices.Equal(got, []uint64{3, 2, 1}) {
		t.Errorf("dead list --older-than (the third's age): %v, want [3 2 1]", got)
	}
	if got := list("--newer-than", mid()); !slices.Equal(got, []uint64{5, 4}) {
		t.Errorf("dead list --newer-than (the third's age): %v, want [5 4]", got)
	}
	if said, code := dead("list", "--limit", "2"); code != 0 || !strings.Contains(said, "--before 4") {
		t.Errorf("dead list --limit 2: exit %d, does not say how to see the next page (--before 4):\n%s", code, said)
	}
	if said, code := dead("show", "--job", "pay-2"); code != 0 || !strings.Contains(said, "dead letter 2") || !strings.Contains(said, "address invalid") {
		t.Errorf("dead show --job pay-2: exit %d\n%s", code, said)
	}
	for _, args := range [][]string{{"show", "99"}, {"show", "99", "--json"}, {"redrive", "99", "--yes"}, {"purge", "2", "99", "--yes"}} {
		said, code := dead(args...)
		if code != 3 || !strings.Contains(said, "no dead letter at sequence 99") || strings.Contains(said, "10037") {
			t.Errorf("dead %q: exit %d, want %d saying \"no dead letter at sequence 99\":\n%s", args, code, 3, said)
		}
	}
	if said, code := dead("show", "99", "--json"); !json.Valid([]byte(said)) {
		t.Errorf("dead show 99 --json: exit %d, not JSON:\n%s", code, said)
	}
	if said, code := dead("show", "--job", "pay-9"); code != 3 || !strings.Contains(said, "no dead letter of job pay-9") {
		t.Errorf("dead show --job pay-9: exit %d, want %d:\n%s", code, 3, said)
	}
	// No selection: refused as a usage error, nothing done.
	for _, args := range [][]string{{"redrive", "--yes"}, {"purge", "--yes"}, {"purge", "3", "--key", "order:1", "--yes"}, {"list", "--older-than", "-1s"}} {
		if said, code := dead(args...); code != 2 {
			t.Errorf("dead %q: exit %d, want 2 (usage):\n%s", args, code, said)
		}
	}
	if got := list(); len(got) != 5 {
		t.Fatalf("refused commands changed the dead letters: %v", got)
	}
	// Filters select what a destructive command does; --dry-run changes nothing.
	if said, code := dead("purge", "--key", "order:2", "--dry-run"); code != 0 || !strings.Contains(said, "will purge 2 dead letters") || !strings.Contains(said, "dry run") {
		t.Errorf("dead purge --key order:2 --dry-run: exit %d\n%s", code, said)
	}
	if said, code := dead("purge", "--key", "order:2", "--yes"); code != 0 || !strings.Contains(said, "purged 2 dead letters") {
		t.Errorf("dead purge --key order:2 --yes: exit %d\n%s", code, said)
	}
	if got := list(); !slices.Equal(got, []uint64{4, 3, 1}) {
		t.Errorf("after purging key order:2: %v, want [4 3 1]", got)
	}
	broken.Store(false)
	if said, code := dead("redrive", "--job", "pay-4", "--yes"); code != 0 || !strings.Contains(said, "dead letter 4 (job pay-4) redriven as") {
		t.Errorf("dead redrive --job pay-4 --yes: exit %d\n%s", code, said)
	}
	if got := list(); !slices.Equal(got, []uint64{3, 1}) {
		t.Errorf("after redriving pay-4: %v, want [3 1]", got)
	}
	testwait.Eventually(t, 10*time.Second, "pay-4 answers with the redriven outcome", func() bool {
		res, err := c.Result(ctx, "pay-4")
		return err == nil && string(res) == "paid"
	})
	if said, code := dead("redrive", "--error", "declined", "--older-than", "1h", "--yes"); code != 0 || !strings.Contains(said, "nothing to redrive") {
		t.Errorf("dead redrive of no match: exit %d\n%s", code, said)
	}
	if got := list(); !slices.Equal(got, []uint64{3, 1}) {
		t.Errorf("a redrive selecting nothing changed the dead letters: %v", got)
	}
	if said, code := dead("purge", "--all", "--yes"); code != 0 || !strings.Contains(said, "purged 2 dead letters") {
		t.Errorf("dead purge --all --yes: exit %d\n%s", code, said)
	}
	if got := list(); len(got) != 0 {
		t.Errorf("after purge --all: %v", got)
	}
}
